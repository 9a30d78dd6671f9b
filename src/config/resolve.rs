//! Validation: a [`SpecFile`] becomes a [`Scenario`] with every value
//! checked once, units converted and derived quantities (the KV block pool)
//! computed. Nothing downstream re-checks user input.

use super::context::Ctx;
use super::error::{ConfigError, closest};
use super::schema::{KvcSection, SpecFile, TierParams};
use super::worker::{resolve_gpu, resolve_worker};
use crate::kvcache::{EvictionPolicy, KvcConfig, PartialChunks, SaveTiming, Tier, TierConfig, WriteMode, WritePolicy};
use crate::metrics::{MAX_INTERVALS, MIN_INTERVAL_SECS};
use crate::router::{AutoscaleConfig, BalancedParams, LoadScale, PolicyKind, RouterConfig};
use crate::storage::DeviceConfig;
use crate::time::{SimDuration, SimTime};
use crate::worker::WorkerConfig;
use crate::worker::model::ModelArch;
use crate::worker::presets::GpuSpec;
use crate::workload::StageConfig;
use std::path::Path;

/// A validated scenario: everything one run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Run seed.
    pub seed: u64,
    /// Workers at start.
    pub num_workers: u32,
    /// Stop time (`None`: run until the workload is done).
    pub time_limit: Option<SimTime>,
    /// Time-series interval.
    pub interval: SimDuration,
    /// The model served.
    pub model: ModelArch,
    /// The GPU of every worker.
    pub gpu: GpuSpec,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Worker settings.
    pub worker: WorkerConfig,
    /// The router.
    pub router: RouterConfig,
    /// Workload stages.
    pub stages: Vec<StageConfig>,
    /// KV-cache tiers.
    pub kvc: KvcConfig,
    /// Prefill and decode pools (`None`: every worker is mixed, per `worker`).
    pub disagg: Option<super::disagg::Disaggregation>,
    /// Worker groups, workers numbered group by group (empty: every
    /// worker is `worker` on `gpu`; else `gpu`, `tp` and `worker` are
    /// `[worker]`'s own, whose block size and context the groups share).
    pub groups: Vec<super::groups::Group>,
    /// With groups, the index of the group autoscaling adds workers to
    /// (`router.router_params.scale_group`, default the last; 0 without groups).
    pub scale_group: usize,
    /// The per-request SLO that `slo_attainment` and `goodput_rps` count.
    pub request_slo: RequestSlo,
}

/// A per-request SLO (DistServe's): TTFT and TPOT at most these (either may be unset).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestSlo {
    /// Most TTFT.
    pub ttft: Option<SimDuration>,
    /// Most TPOT.
    pub tpot: Option<SimDuration>,
}

impl RequestSlo {
    /// Whether either target is set.
    pub fn is_set(&self) -> bool {
        self.ttft.is_some() || self.tpot.is_some()
    }
}

impl Scenario {
    /// Requests the run will send, when every stage says (for progress displays).
    pub fn expected_requests(&self) -> Option<u64> {
        self.stages.iter().map(StageConfig::expected_requests).sum()
    }

    /// The settings of worker `w`: its pool's or group's, else the spec's.
    pub fn worker_config(&self, w: usize) -> &WorkerConfig {
        self.pool_of(w).map_or(&self.worker, |p| &p.worker)
    }

    /// Worker `w`'s pool: its group's, or its `[disaggregation]` pool's
    /// (`None`: `[worker]`'s settings, `num_workers` of them).
    fn pool_of(&self, w: usize) -> Option<&super::disagg::Pool> {
        match &self.disagg {
            _ if !self.groups.is_empty() => Some(&self.groups[self.group_of(w)].pool),
            Some(d) => d.pool_of(w),
            None => None,
        }
    }

    /// The index of worker `w`'s group (with worker groups): the groups'
    /// workers are numbered group by group, and workers added by
    /// autoscaling, after them, are the scale group's.
    pub fn group_of(&self, w: usize) -> usize {
        let mut first = 0;
        for (i, g) in self.groups.iter().enumerate() {
            first += g.pool.count as usize;
            if w < first {
                return i;
            }
        }
        self.scale_group
    }

    /// How worker `w`'s outstanding requests count when the router
    /// compares loads: [`LoadScale::EQUAL`] without worker groups; with
    /// them a request weighs [`crate::router::LOAD_UNIT`] × the most
    /// capable group's capacity / `w`'s group's, rounded (at most
    /// [`crate::router::MAX_LOAD_WEIGHT`]), and the worker has its group's slots.
    pub fn load_scale(&self, w: usize) -> LoadScale {
        if self.groups.is_empty() {
            return LoadScale::EQUAL;
        }
        let group = &self.groups[self.group_of(w)];
        // The router compares a worker with others of its pool only.
        let most = self.groups.iter().filter(|g| g.role == group.role).map(|g| g.capacity).fold(0.0, f64::max);
        let unit = f64::from(crate::router::LOAD_UNIT);
        let weight = (unit * most / group.capacity).round().clamp(unit, f64::from(crate::router::MAX_LOAD_WEIGHT));
        LoadScale { weight: weight as u32, slots: group.slots }
    }

    /// The GPU of worker `w` and how many it has (`tp` × pipeline stages).
    pub fn hardware_of(&self, w: usize) -> (&GpuSpec, u32) {
        match self.pool_of(w) {
            Some(pool) => (&pool.gpu, pool.tp * pool.worker.stages()),
            None => (&self.gpu, self.tp * self.worker.stages()),
        }
    }

    /// The name of worker `w`'s group: its group's, its P/D pool's role, or `default`.
    pub fn group_name(&self, w: usize) -> &str {
        match &self.disagg {
            _ if !self.groups.is_empty() => &self.groups[self.group_of(w)].name,
            Some(d) => d.role_of(w).name(),
            None => "default",
        }
    }
}

/// Validates `file` (read from `source`; relative paths resolve against `base_dir`).
pub fn resolve(file: &SpecFile, source: &str, base_dir: &Path) -> Result<Scenario, ConfigError> {
    let cx = Ctx { source };
    let sim = &file.simulation;
    let time_limit = cx.optional_secs("simulation.simulation_time", sim.simulation_time)?.map(|d| SimTime::ZERO + d);
    let interval_secs = sim.time_series_interval_sec;
    if !(interval_secs.is_finite() && interval_secs >= MIN_INTERVAL_SECS) {
        return Err(cx.err(
            "simulation.time_series_interval_sec",
            format!("must be at least {MIN_INTERVAL_SECS} s, got {interval_secs}"),
            "use e.g. 1.0 (seconds per row of timeseries.parquet)",
        ));
    }
    let interval = SimDuration::from_secs_f64(interval_secs);
    if let Some(limit) = time_limit
        && limit.0 / interval.0 > MAX_INTERVALS
    {
        return Err(cx.err(
            "simulation.time_series_interval_sec",
            format!(
                "{interval_secs} s intervals over simulation_time = {} s would be more than {MAX_INTERVALS} time-series rows",
                limit.as_secs_f64()
            ),
            format!("use an interval of at least {:.3} s", limit.as_secs_f64() / MAX_INTERVALS as f64),
        ));
    }
    let slo_ms = |key: &str, v: Option<f64>| -> Result<Option<SimDuration>, ConfigError> {
        v.map(|ms| cx.positive(key, ms).map(|ms| SimDuration::from_secs_f64((ms / 1e3).min(1e9)))).transpose()
    };
    let request_slo = RequestSlo {
        ttft: slo_ms("simulation.slo_ttft_ms", sim.slo_ttft_ms)?,
        tpot: slo_ms("simulation.slo_tpot_ms", sim.slo_tpot_ms)?,
    };
    let mut num_workers = cx.at_least("simulation.num_workers", i64::from(sim.num_workers), 1)?;
    cx.workers("simulation.num_workers", num_workers)?;

    let model = resolve_model(&cx, file, base_dir)?;
    let hw = &file.worker.hw;
    let tp = cx.at_least("worker.hw.tp", i64::from(hw.tp), 1)?;
    let gpu = resolve_gpu(&cx, file)?;

    let policy = PolicyKind::from_name(&file.router.router_params.policy).ok_or_else(|| {
        let p = &file.router.router_params.policy;
        let hint = match closest(p, PolicyKind::NAMES.iter().copied()) {
            Some(c) => format!("did you mean `{c}`? policies: {}", PolicyKind::NAMES.join(", ")),
            None => format!("policies: {}", PolicyKind::NAMES.join(", ")),
        };
        cx.err("router.router_params.policy", format!("unknown routing policy {p:?}"), hint).schema()
    })?;

    let stages = super::stages::resolve_stages(&cx, file, base_dir)?;
    let mut worker = resolve_worker(&cx, file, &model, &gpu, tp, &stages, base_dir)?;
    let mut kvc = resolve_kvc(&cx, file, &worker, &model)?;
    kvc.publish_events = policy.needs().kv_index;
    worker.event_stride = kvc.chunk_blocks as u32;
    worker.publish_events = kvc.publish_events;
    worker.report_evictions = kvc.store_on_gpu_eviction && !kvc.tiers.is_empty();
    // (Before the pools: groups with a role make them.)
    let groups = super::groups::resolve_groups(&cx, file, &model, &stages, &worker, base_dir)?;
    let mut gpu = gpu;
    let mut tp = tp;
    let disagg = match &file.disaggregation {
        Some(d) => {
            match super::disagg::resolve(&cx, file, d, role_counts(&groups), &model, &stages, &worker, base_dir)? {
                super::disagg::Resolved::Pools(d) => Some(*d),
                super::disagg::Resolved::Mixed(pool) => {
                    // No prefill pool: the decode pool's workers are mixed.
                    let pool = *pool;
                    (num_workers, gpu, tp, worker) = (pool.count, pool.gpu, pool.tp, pool.worker);
                    None
                }
                // No prefill workers: the groups are a mixed fleet (resolve_groups made them so).
                super::disagg::Resolved::MixedGroups => None,
            }
        }
        None => None,
    };
    if let Some(d) = &disagg {
        // The pools say how many workers there are (simulation.num_workers does not apply).
        num_workers = d.workers();
    }
    if !groups.is_empty() {
        // The groups say how many workers there are (`gpu`, `tp` and `worker` stay [worker]'s:
        // the effective configuration writes them, and the groups' overrides apply over them).
        num_workers = groups.iter().map(|g| g.pool.count).sum();
    }
    data_parallel_fleet(
        &cx,
        &worker,
        &groups,
        disagg.is_some(),
        file.router.router_params.enable_scaling,
        num_workers,
    )?;
    let router = resolve_router(&cx, file, policy, num_workers)?;
    let scale_group = match &file.router.router_params.scale_group {
        Some(name) => groups.iter().position(|g| &g.name == name).expect("resolve_groups checked the name"),
        None => groups.len().saturating_sub(1),
    };
    Ok(Scenario {
        seed: sim.seed,
        num_workers,
        time_limit,
        interval,
        model,
        gpu,
        tp,
        worker,
        router,
        stages,
        kvc,
        disagg,
        groups,
        scale_group,
        request_slo,
    })
}

/// With data-parallel attention, the fleet checked: whole groups of ranks
/// (`num_workers` a multiple of `dp_attention`), and none of the fleet
/// shapes not modelled with it (P/D pools, worker groups, autoscaling).
fn data_parallel_fleet(
    cx: &Ctx<'_>,
    worker: &WorkerConfig,
    groups: &[super::groups::Group],
    disagg: bool,
    scaling: bool,
    num_workers: u32,
) -> Result<(), ConfigError> {
    let key = "worker.hw.dp_attention";
    let in_groups = groups.iter().any(|g| g.pool.worker.data_parallel.is_some());
    let Some(dp) = worker.data_parallel.as_ref().map(|d| d.ranks).or(in_groups.then_some(0)) else { return Ok(()) };
    let refuse =
        |what: &str, fix: &str| Err(cx.err(key, format!("data-parallel attention with {what} is not modelled"), fix));
    if !groups.is_empty() || in_groups {
        return refuse("worker groups", "use one [worker] for the whole fleet, or dp_attention = 1");
    }
    if disagg {
        return refuse("prefill/decode pools", "remove [disaggregation], or set dp_attention = 1");
    }
    if scaling {
        return refuse(
            "autoscaling (it adds one engine at a time)",
            "set router.router_params.enable_scaling = false, or dp_attention = 1",
        );
    }
    if !num_workers.is_multiple_of(dp) {
        return Err(cx.err(
            "simulation.num_workers",
            format!("{num_workers} workers are not whole data-parallel groups of dp_attention = {dp} ranks (each worker is one rank)"),
            format!("use a multiple of {dp}, e.g. {}", num_workers.div_ceil(dp) * dp),
        ));
    }
    Ok(())
}

/// The prefill and decode workers of worker groups with roles (`None`
/// without groups: `[disaggregation]`'s own pools say).
fn role_counts(groups: &[super::groups::Group]) -> Option<(u32, u32)> {
    use super::disagg::Role;
    let count = |role: Role| groups.iter().filter(|g| g.role == role).map(|g| g.pool.count).sum::<u32>();
    (!groups.is_empty()).then(|| (count(Role::Prefill), count(Role::Decode)))
}

fn resolve_router(
    cx: &Ctx<'_>,
    file: &SpecFile,
    policy: PolicyKind,
    num_workers: u32,
) -> Result<RouterConfig, ConfigError> {
    let p = &file.router.router_params;
    let key = |k: &str| format!("router.router_params.{k}");
    let secs0 = |k: &str, v: f64| -> Result<SimDuration, ConfigError> {
        if v.is_finite() && v >= 0.0 {
            Ok(SimDuration::from_secs_f64(v))
        } else {
            Err(cx.err(k, format!("must be ≥ 0 seconds, got {v}"), "use 0 for no delay"))
        }
    };
    let w = &p.tier_weights;
    let mut tier_weights = [0.0; 4];
    for (i, (name, v)) in
        [("GPU", w.GPU), ("CPUMemory", w.CPUMemory), ("LocalNVMe", w.LocalNVMe), ("DistributedFS", w.DistributedFS)]
            .into_iter()
            .enumerate()
    {
        if !(v.is_finite() && v >= 0.0) {
            return Err(cx.err(
                &key(&format!("tier_weights.{name}")),
                format!("must be ≥ 0, got {v}"),
                "weights are relative; GPU = 1 is natural",
            ));
        }
        tier_weights[i] = v;
    }
    for (k, v) in [
        ("balanced_prefix_weight", p.balanced_prefix_weight),
        ("balanced_load_weight", p.balanced_load_weight),
        ("balance_abs_threshold", p.balance_abs_threshold),
        ("balance_rel_threshold", p.balance_rel_threshold),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(cx.err(
                &key(k),
                format!("must be ≥ 0, got {v}"),
                "see the Balanced policy's defaults in the README",
            ));
        }
    }
    if p.max_event_batch_size == 0 {
        return Err(cx.err(&key("max_event_batch_size"), "must be at least 1", "Opal's default is 64"));
    }
    // The scaling keys are checked whether or not scaling is on: a bad value
    // is a mistake even where it is not read yet.
    cx.workers(&key("max_workers"), p.max_workers)?;
    if p.max_workers == 0 {
        return Err(cx.err(&key("max_workers"), "must be at least 1", "Opal's default is 50"));
    }
    let scale_latency = secs0(&key("scale_latency"), p.scale_latency)?;
    let autoscale = if p.enable_scaling {
        if p.max_workers < num_workers {
            return Err(cx.err(
                &key("max_workers"),
                format!("max_workers ({}) is below the {num_workers} workers the run starts with", p.max_workers),
                "raise max_workers or start with fewer workers",
            ));
        }
        Some(AutoscaleConfig { max_queue_threshold: p.max_queue_threshold, scale_latency, max_workers: p.max_workers })
    } else {
        None
    };
    let system = file.worker.worker_params.periodic_infra_update_time;
    if !(system.is_finite() && system > 0.0) {
        return Err(cx.err(
            "worker.worker_params.periodic_infra_update_time",
            format!("must be a positive number of seconds, got {system}"),
            "the default is 5 (Opal's configs/defaults.json has 30)",
        ));
    }
    Ok(RouterConfig {
        policy,
        collection_interval: secs0(
            &key("periodic_infra_update_collection_time"),
            p.periodic_infra_update_collection_time,
        )?,
        max_event_batch: p.max_event_batch_size,
        batch_time: secs0(&key("event_batch_time"), p.event_batch_time)?,
        system_interval: SimDuration::from_secs_f64(system),
        tier_weights,
        balanced: BalancedParams {
            prefix_weight: p.balanced_prefix_weight,
            load_weight: p.balanced_load_weight,
            abs_threshold: p.balance_abs_threshold,
            rel_threshold: p.balance_rel_threshold,
        },
        autoscale,
    })
}

fn resolve_model(cx: &Ctx<'_>, file: &SpecFile, base_dir: &Path) -> Result<ModelArch, ConfigError> {
    let mut model = resolve_architecture(cx, file, base_dir)?;
    model
        .set_kv_cache_dtype(&file.worker.vllm_params.kv_cache_dtype)
        .map_err(|e| cx.err("worker.vllm_params.kv_cache_dtype", e, "vLLM's --kv-cache-dtype: auto or fp8").schema())?;
    Ok(model)
}

fn resolve_architecture(cx: &Ctx<'_>, file: &SpecFile, base_dir: &Path) -> Result<ModelArch, ConfigError> {
    let p = &file.model.model_params;
    let from_file = |key: &str, path: &Path| {
        ModelArch::from_hf_config(path).map_err(|e| {
            cx.err(key, e, "point it at a Hugging Face config.json of a model family listed in the README").schema()
        })
    };
    if let Some(cfg) = &p.config_path {
        return from_file("model.model_params.config_path", &base_dir.join(cfg));
    }
    if let Some(dir) = &p.config_dir {
        let path = base_dir.join(dir).join(&p.name).join("config.json");
        if path.exists() {
            return from_file("model.model_params.config_dir", &path);
        }
    }
    ModelArch::preset(&p.name).ok_or_else(|| {
        cx.err(
            "model.model_params.name",
            format!("unknown model {:?} (no preset, and no <config_dir>/{}/config.json)", p.name, p.name),
            format!(
                "use a preset ({}) or set model.model_params.config_path to a config.json",
                ModelArch::preset_list()
            ),
        )
        .schema()
    })
}

/// A tier's defaults: (bandwidth GB/s, latency ns, concurrency, capacity GiB),
/// the original Opal's `configs/defaults.json` values.
pub(super) fn tier_defaults(tier: Tier) -> (f64, f64, u64, f64) {
    match tier {
        Tier::Cpu => (50.0, 200.0, 1_000_000, 8.0),
        Tier::Nvme => (10.0, 10_000.0, 1_000, 1024.0),
        Tier::Dfs => (100.0, 100_000.0, 1_000, 1_048_576.0),
        Tier::Gpu => unreachable!("not a kvc tier"),
    }
}

/// An optional price or power figure: absent is 0, else finite and ≥ 0.
fn non_negative(cx: &Ctx<'_>, key: &str, v: Option<f64>, example: &str) -> Result<f64, ConfigError> {
    match v {
        None => Ok(0.0),
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Some(x) => Err(cx.err(key, format!("must be a number ≥ 0, got {x}"), format!("use {example}"))),
    }
}

fn resolve_kvc(
    cx: &Ctx<'_>,
    file: &SpecFile,
    worker: &WorkerConfig,
    model: &ModelArch,
) -> Result<KvcConfig, ConfigError> {
    let k: &KvcSection = &file.kvc;
    let block = worker.block_size;
    if k.chunk_size == 0 || u64::from(k.chunk_size) % block != 0 {
        // Blame the key the spec sets (the chunk size left at its default: the block size).
        if k.chunk_size == KvcSection::default().chunk_size && k.chunk_size != 0 {
            return Err(cx.err(
                "worker.vllm_params.block_size",
                format!("{block} does not divide kvc.chunk_size ({}, its default): a stored chunk is whole blocks", k.chunk_size),
                format!("use a block size that divides {} (vLLM's are 16 or 32), or set kvc.chunk_size to a multiple of {block}, e.g. {}", k.chunk_size, block * 16),
            ));
        }
        return Err(cx.err(
            "kvc.chunk_size",
            format!("{} is not a multiple of the block size ({block})", k.chunk_size),
            format!("use a multiple of worker.vllm_params.block_size, e.g. {}", block * 16),
        ));
    }
    let all = [Tier::Cpu, Tier::Nvme, Tier::Dfs].map(|t| tier_config(cx, k, t));
    let all: Vec<TierConfig> = all.into_iter().collect::<Result<_, _>>()?;
    let mut tiers: Vec<TierConfig> = Vec::new();
    for (i, name) in k.kvc_tiers.iter().enumerate() {
        let key = format!("kvc.kvc_tiers.{i}");
        let tier = Tier::from_opal_name(name).ok_or_else(|| {
            let names = ["CPUMemory", "LocalNVMe", "DistributedFS"];
            let hint = match closest(name, names) {
                Some(c) => format!("did you mean `{c}`? tiers: {}", names.join(", ")),
                None => format!("tiers: {}", names.join(", ")),
            };
            cx.err(&key, format!("unknown tier {name:?}"), hint).schema()
        })?;
        if tiers.iter().any(|t| t.tier == tier) {
            return Err(cx.err(&key, format!("{name} is listed twice"), "list each tier once, fastest first"));
        }
        tiers.push(all[tier as usize - 1].clone());
    }
    let write_policy = match k.write_policy.to_ascii_lowercase().as_str() {
        "write_through" => WritePolicy::WriteThrough,
        "spill" => WritePolicy::Spill,
        other => {
            return Err(cx
                .err("kvc.write_policy", format!("unknown write policy {other:?}"), "use write_through or spill")
                .schema());
        }
    };
    let write_mode = match k.write_mode.to_ascii_lowercase().as_str() {
        "async" => WriteMode::Async,
        "sync" => WriteMode::Sync,
        other => {
            return Err(cx
                .err("kvc.write_mode", format!("unknown write mode {other:?}"), "use async or sync")
                .schema());
        }
    };
    let save_timing = match k.save_timing.to_ascii_lowercase().as_str() {
        "on_compute" => SaveTiming::OnCompute,
        "on_finish" => SaveTiming::OnFinish,
        other => {
            return Err(cx
                .err("kvc.save_timing", format!("unknown save timing {other:?}"), "use on_compute or on_finish")
                .schema());
        }
    };
    let partial_chunks = match k.partial_chunk_key.to_ascii_lowercase().as_str() {
        "tokens" => PartialChunks::ExactTokens,
        "blocks" => PartialChunks::FullBlocks,
        other => {
            return Err(cx
                .err("kvc.partial_chunk_key", format!("unknown partial chunk key {other:?}"), "use tokens or blocks")
                .schema());
        }
    };
    let coalesce = file.worker.worker_params.kvcevent_coalesce_time;
    if !(coalesce.is_finite() && coalesce >= 0.0) {
        return Err(cx.err(
            "worker.worker_params.kvcevent_coalesce_time",
            format!("must be ≥ 0 seconds, got {coalesce}"),
            "Opal's default is 30",
        ));
    }
    Ok(KvcConfig {
        tiers,
        chunk_blocks: u64::from(k.chunk_size) / block,
        save_unfull_chunk: k.save_unfull_chunk,
        partial_chunks,
        block_size: block,
        save_decode_cache: k.save_decode_cache,
        write_policy,
        write_mode,
        save_timing,
        store_on_gpu_eviction: k.store_on_gpu_eviction,
        write_back_hits: k.write_back_hits,
        block_bytes: block * model.kv_bytes_per_token(),
        event_coalesce: SimDuration::from_secs_f64(coalesce),
        publish_events: false,
    })
}

/// Tier `tier`'s section of `[kvc]`, checked (whether or not `kvc_tiers`
/// lists it: a bad value is a mistake even where it is not read yet).
fn tier_config(cx: &Ctx<'_>, k: &KvcSection, tier: Tier) -> Result<TierConfig, ConfigError> {
    let p: &TierParams = match tier {
        Tier::Cpu => &k.CPUMemory,
        Tier::Nvme => &k.LocalNVMe,
        Tier::Dfs => &k.DistributedFS,
        Tier::Gpu => unreachable!("not a kvc tier"),
    };
    let defaults = tier_defaults(tier);
    let at = |f: &str| format!("kvc.{}.{f}", tier.opal_name());
    let bandwidth = cx.positive(&at("bandwidth_GBps"), p.bandwidth_GBps.unwrap_or(defaults.0))?;
    let latency = p.latency_nsec.unwrap_or(defaults.1);
    if !(latency.is_finite() && latency >= 0.0) {
        return Err(cx.err(&at("latency_nsec"), format!("must be ≥ 0, got {latency}"), "use e.g. 200 for DRAM"));
    }
    let concurrency = p.concurrency.unwrap_or(defaults.2);
    if concurrency == 0 {
        return Err(cx.err(&at("concurrency"), "must be at least 1", "use e.g. 1000"));
    }
    let capacity = p.capacity_GB.unwrap_or(defaults.3);
    if !(capacity.is_finite() && capacity >= 0.0) {
        return Err(cx.err(&at("capacity_GB"), format!("must be ≥ 0 GiB, got {capacity}"), "use e.g. 64"));
    }
    let eviction = match &p.eviction_policy {
        None => EvictionPolicy::Lru,
        Some(e) => EvictionPolicy::from_name(e).ok_or_else(|| {
            cx.err(&at("eviction_policy"), format!("unknown eviction policy {e:?}"), "use lru, lfu or fifo").schema()
        })?,
    };
    let client = match (tier, p.client_bandwidth_GBps) {
        (_, None) => None,
        (Tier::Dfs, Some(c)) => Some(cx.positive(&at("client_bandwidth_GBps"), c)? * 1e9),
        (_, Some(_)) => {
            return Err(cx.err(
                &at("client_bandwidth_GBps"),
                "a per-client link cap only applies to the shared DistributedFS",
                "remove it; a per-worker tier has one client",
            ));
        }
    };
    Ok(TierConfig {
        tier,
        device: DeviceConfig {
            bandwidth_bps: bandwidth * 1e9,
            latency: SimDuration::from_secs_f64(latency / 1e9),
            concurrency: concurrency.min(u64::from(u32::MAX)) as u32,
            client_bandwidth_bps: client,
        },
        capacity_bytes: (capacity * (1u64 << 30) as f64) as u64,
        eviction,
        usd_per_gib_hour: non_negative(cx, &at("usd_per_gb_hour"), p.usd_per_gb_hour, "e.g. 0.0036 for DRAM")?,
        watts_per_gib: non_negative(cx, &at("watts_per_gb"), p.watts_per_gb, "e.g. 0.375 for DDR5 RDIMMs")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_spec;
    use crate::worker::perf::StepModel;
    use crate::workload::Dist;

    fn scenario(text: &str) -> Result<Scenario, ConfigError> {
        resolve(&parse_spec(text, "t.toml")?, "t.toml", Path::new("."))
    }

    #[test]
    fn the_token_budget_binds_without_chunked_prefill_and_is_checked_as_vllm_checks_it() {
        // Unset: 8,192 with chunked prefill; max(max_model_len, 8192) without
        // (vLLM's SchedulerConfig default), never max_model_len × max_num_seqs.
        let off = "[worker.vllm_params]\nchunked_prefill = false\n";
        assert_eq!(scenario(off).unwrap().worker.token_budget, 131_072, "granite-3.3-8b's context length");
        let stage = "[[workload.stages]]\ntype = \"UniformReqRate\"\n[workload.stages.workload_params]\nprompt_size_min = 32\nprompt_size_max = 3000\noutput_tokens_max = 64\n";
        let short = format!("{stage}{off}max_model_len = 4096\n");
        assert_eq!(scenario(&short).unwrap().worker.token_budget, 8192);
        let set = format!("{short}max_num_batched_tokens = 4096\n");
        assert_eq!(scenario(&set).unwrap().worker.token_budget, 4096);
        // A budget below max_model_len without chunking is refused (vLLM's _verify_args).
        let below = format!("{short}max_num_batched_tokens = 2048\n");
        let e = scenario(&below).unwrap_err().to_string();
        assert!(e.contains("`worker.vllm_params.max_num_batched_tokens`"), "{e}");
        assert!(e.contains("(2048) is smaller than max_model_len (4096)"), "{e}");
        assert!(e.contains("fix: increase max_num_batched_tokens"), "{e}");
        // With chunking the same budget is fine.
        let chunked = below.replace("false", "true");
        assert_eq!(scenario(&chunked).unwrap().worker.token_budget, 2048);
    }

    #[test]
    fn the_engines_block_count_replaces_the_memory_arithmetic_when_given() {
        let stage = "[[workload.stages]]\ntype = \"UniformReqRate\"\n[workload.stages.workload_params]\nprompt_size_max = 1000\noutput_tokens_max = 64\n[worker.vllm_params]\nmax_model_len = 4096\n";
        let computed = scenario(stage).unwrap().worker.total_blocks;
        assert!(computed > 10_000, "{computed}");
        let given = scenario(&format!("{stage}num_gpu_blocks_override = 1000\n")).unwrap();
        assert_eq!(given.worker.total_blocks, 1000);
        // One 4,096-token sequence needs 256 blocks of 16: fewer is refused by the key.
        let e = scenario(&format!("{stage}num_gpu_blocks_override = 255\n")).unwrap_err().to_string();
        assert!(e.contains("`worker.vllm_params.num_gpu_blocks_override`") && e.contains("256 blocks of 16"), "{e}");
        assert!(scenario(&format!("{stage}num_gpu_blocks_override = 0\n")).is_err());
    }

    #[test]
    fn defaults_resolve_to_opal_values() {
        let s = scenario("").unwrap();
        assert_eq!(s.seed, 42);
        assert_eq!(s.num_workers, 1);
        assert_eq!(s.time_limit, None);
        assert_eq!(s.model.name, "granite-3.3-8b");
        assert_eq!(s.gpu.name, "H100");
        assert_eq!(s.worker.max_running, 256);
        assert_eq!(s.worker.token_budget, 8192);
        assert_eq!(s.worker.io_slots, 8);
        assert_eq!(s.router.policy, PolicyKind::MaxPrefix, "Opal's default policy");
        assert_eq!(s.router.collection_interval, SimDuration::from_secs(30));
        assert!(s.kvc.publish_events, "MaxPrefix reads the KV index");
        let crate::workload::StageKind::Rate(st) = &s.stages[0].kind else { panic!("rate stage expected") };
        assert_eq!((st.rate, st.total), (2.0, Some(100)));
        assert_eq!(st.prompt, Dist::Uniform { min: 32.0, max: 16384.0 });
        assert_eq!(st.output, Dist::Uniform { min: 32.0, max: 128.0 });
        // Opal's kvc defaults: one CPU tier of 8 GiB at 50 GB/s, 256-token chunks.
        assert_eq!(s.kvc.tiers.len(), 1);
        assert_eq!(s.kvc.tiers[0].tier, Tier::Cpu);
        assert_eq!(s.kvc.tiers[0].capacity_bytes, 8 << 30);
        assert_eq!(s.kvc.tiers[0].device.bandwidth_bps, 50e9);
        assert_eq!(s.kvc.chunk_blocks, 16);
        assert!(s.worker.prefix_caching);
    }

    #[test]
    fn kv_pool_for_llama_8b_on_h100_matches_the_formula() {
        let s = scenario("[model.model_params]\nname = \"llama-3.1-8b\"\n").unwrap();
        // 80 GiB × 0.9 = 77,309,411,328 B; weights 16,060,522,496 B; left 61,248,888,832 B;
        // block = 16 × 131,072 = 2,097,152 B → 29,205 blocks (29,205.5…, floored).
        let expected = ((80.0 * 1073741824.0 * 0.9 - 16_060_522_496.0) / 2_097_152.0_f64).floor() as u64;
        assert_eq!(expected, 29_205);
        assert_eq!(s.worker.total_blocks, expected);
    }

    #[test]
    fn a_model_that_does_not_fit_is_rejected_with_a_fix() {
        let e = scenario("[model.model_params]\nname = \"llama-3.1-70b\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("worker.hw"));
        assert!(e.message.contains("does not fit in GPU memory"), "{e}");
        assert!(e.hint.unwrap().contains("worker.hw.tp"));
        // Two H100s hold the weights, but not also the KV of a 131,072-token sequence…
        let e = scenario("[model.model_params]\nname = \"llama-3.1-70b\"\n[worker.hw]\ntp = 2\n").unwrap_err();
        assert!(e.message.contains("one maximum-length sequence (131072 tokens"), "{e}");
        // …unless the engine serves shorter sequences, as with vLLM's --max-model-len.
        scenario("[model.model_params]\nname = \"llama-3.1-70b\"\n[worker.hw]\ntp = 2\n[worker.vllm_params]\nmax_model_len = 32768\n").unwrap();
    }

    #[test]
    fn bad_values_name_their_key() {
        let rate = "[[workload.stages]]\ntype = \"ExponentialReqRate\"\n[workload.stages.workload_params]\nrequest_rate = -2.0\n";
        assert_eq!(scenario(rate).unwrap_err().key.as_deref(), Some("workload.stages.0.workload_params.request_rate"));
        let sizes = "[[workload.stages]]\ntype = \"UniformReqRate\"\n[workload.stages.workload_params]\nprompt_size_min = 900\nprompt_size_max = 100\n";
        let e = scenario(sizes).unwrap_err();
        assert!(e.message.contains("prompt_size_min (900) is greater than prompt_size_max (100)"), "{e}");
        let kind = "[[workload.stages]]\ntype = \"ExponentialRate\"\n";
        assert!(scenario(kind).unwrap_err().hint.unwrap().contains("did you mean `ExponentialReqRate`"));
        let never =
            "[[workload.stages]]\ntype = \"UniformReqRate\"\n[workload.stages.workload_params]\ntotal_requests = -1\n";
        assert!(scenario(never).unwrap_err().message.contains("would never end"));
        let policy = "[router.router_params]\npolicy = \"RoundRobbin\"\n";
        assert!(scenario(policy).unwrap_err().hint.unwrap().contains("did you mean `RoundRobin`"));
    }

    #[test]
    fn opal_string_coefficients_are_accepted() {
        let s = scenario("[worker.inference_params]\nmodel = \"roofline\"\na = \"4\"\nb = \"24\"\n").unwrap();
        let StepModel::Roofline(r, _) = &s.worker.perf else { panic!("roofline expected") };
        assert_eq!((r.a, r.b), (4.0, 24.0));
        let four = "[worker.inference_params]\nmodel = \"roofline\"\na = \"four\"\n";
        assert!(scenario(four).unwrap_err().message.contains("not a number"));
    }

    #[test]
    fn a_key_of_another_step_model_is_refused_with_the_model_it_belongs_to() {
        let e = scenario("[worker.inference_params]\na = 3\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("worker.inference_params.a"), "{e}");
        assert!(e.message.contains("roofline") && e.message.contains("operators"), "{e}");
        assert!(e.hint.as_deref().unwrap().contains("model = \"roofline\""), "{e}");
        let e = scenario("[worker.inference_params]\nmodel = \"roofline\"\ncompute_scale = 2\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("worker.inference_params.compute_scale"), "{e}");
        let e = scenario("[worker.inference_params]\nmemory_scale = 0\n").unwrap_err();
        assert!(e.message.contains("> 0"), "{e}");
    }
}
