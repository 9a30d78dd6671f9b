//! `[disaggregation]`: prefill and decode worker pools, each resolved as a
//! worker of its own (its GPU, TP and vLLM settings over the spec's), the
//! conditional-disaggregation thresholds and the KV link.

use super::context::Ctx;
use super::error::ConfigError;
use super::schema::{DisaggregationSection, PoolSection, SpecFile, VllmParams, WorkerGroupSection};
use super::worker::{resolve_gpu, resolve_worker};
use crate::router::pd::KvPath;
use crate::storage::DeviceConfig;
use crate::time::SimDuration;
use crate::worker::WorkerConfig;
use crate::worker::model::ModelArch;
use crate::worker::presets::GpuSpec;
use crate::workload::StageConfig;
use std::path::Path;

/// A worker's part in the platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Prefill and decode (no disaggregation).
    Mixed,
    /// Computes prompts (and the first token); decode happens elsewhere.
    Prefill,
    /// Decodes requests prefilled elsewhere (and prefills short ones itself).
    Decode,
}

impl Role {
    /// The name in specs and tables.
    pub fn name(self) -> &'static str {
        match self {
            Role::Mixed => "mixed",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// A pool of identical workers.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Workers in it.
    pub count: u32,
    /// Their GPU.
    pub gpu: GpuSpec,
    /// Their tensor-parallel degree.
    pub tp: u32,
    /// Their settings.
    pub worker: WorkerConfig,
}

/// Resolved `[disaggregation]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Disaggregation {
    /// Workers in the prefill pool (workers `0 … prefill_workers − 1`).
    pub prefill_workers: u32,
    /// Workers in the decode pool (the workers after them).
    pub decode_workers: u32,
    /// The prefill and decode pools' workers when `[disaggregation.prefill]`
    /// and `[disaggregation.decode]` give them (`None`: worker groups with a
    /// `role` make the pools, and say each worker's settings).
    pub pools: Option<Box<(Pool, Pool)>>,
    /// Prefill remotely only when the uncached part of the prompt is longer than this (tokens).
    pub max_local_prefill_length: u64,
    /// Prefill locally when the chosen prefill worker has this many requests waiting (`None`: never for that).
    pub max_prefill_queue_size: Option<u64>,
    /// Each decode worker's link, over which it pulls KV.
    pub link: DeviceConfig,
    /// How the prompt's KV reaches the decode worker.
    pub kv_path: KvPath,
}

impl Disaggregation {
    /// The role of worker `w`.
    pub fn role_of(&self, w: usize) -> Role {
        if w < self.prefill_workers as usize { Role::Prefill } else { Role::Decode }
    }

    /// Worker `w`'s pool, when the pools are `[disaggregation]`'s own.
    pub fn pool_of(&self, w: usize) -> Option<&Pool> {
        self.pools.as_ref().map(|p| if w < self.prefill_workers as usize { &p.0 } else { &p.1 })
    }

    /// Workers in both pools.
    pub fn workers(&self) -> u32 {
        self.prefill_workers + self.decode_workers
    }
}

/// What a P/D pool or a worker group sets over `[worker]`.
pub(super) struct PoolKeys<'a> {
    count: i64,
    gpu: Option<&'a String>,
    tp: Option<u32>,
    pp: Option<u32>,
    vllm_params: Option<&'a toml::Table>,
    usd_per_gpu_hour: Option<f64>,
}

impl<'a> From<&'a PoolSection> for PoolKeys<'a> {
    fn from(p: &'a PoolSection) -> Self {
        PoolKeys {
            count: p.count,
            gpu: p.gpu.as_ref(),
            tp: p.tp,
            pp: p.pp,
            vllm_params: p.vllm_params.as_ref(),
            usd_per_gpu_hour: None,
        }
    }
}

impl<'a> From<&'a WorkerGroupSection> for PoolKeys<'a> {
    fn from(g: &'a WorkerGroupSection) -> Self {
        PoolKeys {
            count: g.count,
            gpu: g.gpu.as_ref(),
            tp: g.tp,
            pp: g.pp,
            vllm_params: g.vllm_params.as_ref(),
            usd_per_gpu_hour: g.usd_per_gpu_hour,
        }
    }
}

/// One pool's (or group's) worker: the spec's settings with its GPU, TP,
/// price and vLLM overrides; `at` is its key (`disaggregation.prefill`,
/// `worker_groups.2`).
#[allow(clippy::too_many_arguments)]
pub(super) fn resolve_pool(
    cx: &Ctx<'_>,
    file: &SpecFile,
    p: &PoolKeys<'_>,
    at: &str,
    model: &ModelArch,
    stages: &[StageConfig],
    base: &WorkerConfig,
    base_dir: &Path,
) -> Result<Pool, ConfigError> {
    let key = |k: &str| format!("{at}.{k}");
    let count = cx.at_least(&key("count"), p.count, 0)?;
    cx.workers(&key("count"), count)?;
    let mut f = file.clone();
    if let Some(gpu) = &p.gpu
        && !gpu.eq_ignore_ascii_case(&f.worker.hw.gpu)
    {
        let hw = &mut f.worker.hw;
        hw.gpu = (*gpu).clone();
        // The spec's overrides describe its own GPU, not this one.
        (hw.memory_gb, hw.tflops, hw.mem_bw_TBps, hw.tflops_fp8, hw.link_GBps) = (None, None, None, None, None);
        (hw.max_watts, hw.idle_watts, hw.active_watts, hw.compute_watts, hw.memory_watts) =
            (None, None, None, None, None);
    }
    if let Some(tp) = p.tp {
        f.worker.hw.tp = tp;
    }
    if let Some(pp) = p.pp {
        f.worker.hw.pp = pp;
    }
    if p.usd_per_gpu_hour.is_some() {
        f.worker.hw.usd_per_gpu_hour = p.usd_per_gpu_hour;
    }
    if let Some(over) = &p.vllm_params {
        let toml::Value::Table(mut merged) = toml::Value::try_from(&f.worker.vllm_params).expect("serialisable") else {
            unreachable!("a struct serialises to a table")
        };
        merged.extend((*over).clone());
        f.worker.vllm_params = super::from_table::<VllmParams>(&merged, cx.source, &key("vllm_params"))?;
    }
    // An error about a key the pool sets names the pool's key (and so its
    // line), not the `[worker]` key it stands in for; one about the fit of
    // the pool's workers says which pool.
    let in_pool = |mut e: ConfigError| {
        let pool_key = match e.key.as_deref() {
            Some(k) if k.starts_with("worker.hw.gpu") && p.gpu.is_some() => Some(key("gpu")),
            Some("worker.hw.tp") if p.tp.is_some() => Some(key("tp")),
            Some(k) if k.starts_with("worker.hw.pp") && p.pp.is_some() => Some(key("pp")),
            Some("worker.hw.usd_per_gpu_hour") if p.usd_per_gpu_hour.is_some() => Some(key("usd_per_gpu_hour")),
            Some(k) => k
                .strip_prefix("worker.vllm_params.")
                .filter(|v| p.vllm_params.as_ref().is_some_and(|o| o.contains_key(*v)))
                .map(|v| key(&format!("vllm_params.{v}"))),
            None => None,
        };
        match pool_key {
            Some(k) if k.ends_with(".gpu") => {
                // A pool names a preset; a custom GPU's numbers are [worker.hw]'s.
                e.message = e.message.replace(" and `worker.hw.memory_gb` is not set", "");
                e.hint = e.hint.map(|h| {
                    h.replace(
                        " or set memory_gb, tflops and mem_bw_TBps",
                        " (a pool's GPU is a preset, or [worker.hw]'s own)",
                    )
                });
                e.key = Some(k);
            }
            Some(k) => e.key = Some(k),
            None if e.key.as_deref() == Some("worker.hw") && (p.gpu.is_some() || p.tp.is_some() || p.pp.is_some()) => {
                e.key = Some(at.to_string());
                e.message = format!("in the [{at}] pool: {}", e.message);
            }
            None => {}
        }
        e
    };
    let gpu = resolve_gpu(cx, &f).map_err(in_pool)?;
    let tp = cx.at_least(&key("tp"), i64::from(f.worker.hw.tp), 1)?;
    let mut worker = resolve_worker(cx, &f, model, &gpu, tp, stages, base_dir).map_err(in_pool)?;
    if worker.block_size != base.block_size {
        return Err(cx.err(
            &key("vllm_params.block_size"),
            format!("{} tokens per block, but the other workers use {}", worker.block_size, base.block_size),
            "every pool must use the same block_size (KV moves between them block by block)",
        ));
    }
    (worker.event_stride, worker.publish_events, worker.report_evictions) =
        (base.event_stride, base.publish_events, base.report_evictions);
    Ok(Pool { count, gpu, tp, worker })
}

/// What `[disaggregation]` resolves to.
#[derive(Clone, Debug)]
pub(super) enum Resolved {
    /// Two pools.
    Pools(Box<Disaggregation>),
    /// `prefill.count = 0`: the decode pool's workers serve requests whole.
    Mixed(Box<Pool>),
    /// Worker groups with no prefill workers: the groups serve requests whole.
    MixedGroups,
}

/// Resolves `section` over the spec's worker settings (`base`, for the
/// block size every pool must share); with worker groups (each with a
/// role, prefill groups first), the groups make the pools: `groups` is
/// then their prefill and decode workers.
#[allow(clippy::too_many_arguments)]
pub(super) fn resolve(
    cx: &Ctx<'_>,
    file: &SpecFile,
    section: &DisaggregationSection,
    groups: Option<(u32, u32)>,
    model: &ModelArch,
    stages: &[StageConfig],
    base: &WorkerConfig,
    base_dir: &Path,
) -> Result<Resolved, ConfigError> {
    let key = |k: &str| format!("disaggregation.{k}");
    let (prefill_workers, decode_workers, pools) = if let Some((prefill, decode)) = groups {
        if prefill == 0 {
            return Ok(Resolved::MixedGroups);
        }
        if decode == 0 {
            return Err(cx.err(
                "worker_groups",
                "the decode groups are empty (every worker would only prefill)",
                "give a group with role = \"decode\" at least one worker",
            ));
        }
        (prefill, decode, None)
    } else {
        let missing = |which: &str| {
            cx.err(
                &key(which),
                format!("disaggregation needs a [disaggregation.{which}] pool"),
                format!("add [disaggregation.{which}] with count (and optionally gpu, tp, pp, vllm_params), or worker groups with role = \"{which}\""),
            )
        };
        let pd = section.prefill.as_ref().ok_or_else(|| missing("prefill"))?;
        let dd = section.decode.as_ref().ok_or_else(|| missing("decode"))?;
        let prefill = resolve_pool(cx, file, &pd.into(), &key("prefill"), model, stages, base, base_dir)?;
        let decode = resolve_pool(cx, file, &dd.into(), &key("decode"), model, stages, base, base_dir)?;
        cx.workers(&key("decode.count"), prefill.count + decode.count)?;
        if decode.count == 0 {
            return Err(cx.err(&key("decode.count"), "the decode pool is empty", "give it at least one worker"));
        }
        if prefill.count == 0 {
            return Ok(Resolved::Mixed(Box::new(decode)));
        }
        (prefill.count, decode.count, Some(Box::new((prefill, decode))))
    };
    if file.router.router_params.enable_scaling {
        return Err(cx.err(
            "router.router_params.enable_scaling",
            "autoscaling is not modelled with disaggregated pools",
            "set enable_scaling = false, or size the pools in a sweep",
        ));
    }
    let max_local = section.max_local_prefill_length;
    if max_local < 0 {
        return Err(cx.err(
            &key("max_local_prefill_length"),
            format!("must be ≥ 0, got {max_local}"),
            "0 sends every prefill to the prefill pool",
        ));
    }
    let max_queue = match section.max_prefill_queue_size {
        -1 => None,
        n if n >= 1 => Some(n as u64),
        n => {
            return Err(cx.err(
                &key("max_prefill_queue_size"),
                format!("must be -1 (no limit) or ≥ 1, got {n}"),
                "use -1 to always send long prompts to the prefill pool",
            ));
        }
    };
    let bandwidth = cx.positive(&key("link_bandwidth_GBps"), section.link_bandwidth_GBps)?;
    let latency = section.link_latency_usec;
    if !(latency.is_finite() && latency >= 0.0) {
        return Err(cx.err(&key("link_latency_usec"), format!("must be ≥ 0, got {latency}"), "e.g. 20 (µs)"));
    }
    let kv_path = match section.kv_path.to_ascii_lowercase().as_str() {
        "link" => KvPath::Link,
        "store" => KvPath::Store,
        other => {
            return Err(cx.err(&key("kv_path"), format!("unknown KV path {other:?}"), "use link or store").schema());
        }
    };
    let has_dfs = file.kvc.kvc_tiers.iter().any(|t| t.eq_ignore_ascii_case("DistributedFS"));
    let spill = file.kvc.write_policy.eq_ignore_ascii_case("spill") && file.kvc.kvc_tiers.len() > 1;
    if kv_path == KvPath::Store && (!has_dfs || spill) {
        return Err(cx.err(
            &key("kv_path"),
            "the KV path through the store needs every prompt written to the shared DistributedFS tier",
            "add \"DistributedFS\" to kvc.kvc_tiers with write_policy = \"write_through\" (or make it the only tier), or use kv_path = \"link\"",
        ));
    }
    Ok(Resolved::Pools(Box::new(Disaggregation {
        kv_path,
        prefill_workers,
        decode_workers,
        pools,
        max_local_prefill_length: max_local as u64,
        max_prefill_queue_size: max_queue,
        link: DeviceConfig {
            bandwidth_bps: bandwidth * 1e9,
            latency: SimDuration::from_secs_f64(latency * 1e-6),
            concurrency: u32::MAX,
            client_bandwidth_bps: None,
        },
    })))
}
