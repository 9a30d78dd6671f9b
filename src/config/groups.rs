//! `[[worker_groups]]`: a fleet of unequal workers behind one router — each
//! group `[worker]`'s settings with its own GPU, TP, price and vLLM
//! overrides (resolved as a P/D pool is), and each worker's capacity, by
//! which load-based routing divides its load.

use super::context::Ctx;
use super::disagg::{Pool, PoolKeys, Role, resolve_pool};
use super::error::ConfigError;
use super::schema::SpecFile;
use crate::rng::SeedTree;
use crate::worker::WorkerConfig;
use crate::worker::model::ModelArch;
use crate::worker::perf::{PrefillChunk, StepWork};
use crate::workload::{Dist, StageConfig, StageKind};
use std::path::Path;

/// One group of identical workers in a mixed fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// Its name (unique in the fleet).
    pub name: String,
    /// Its workers: how many, their GPU, TP and settings.
    pub pool: Pool,
    /// Requests per second one of its workers serves at saturation (given,
    /// or [`estimated_capacity`]); only the ratios between groups matter.
    pub capacity: f64,
    /// Requests one of its workers runs at once for the mean request
    /// ([`concurrency`]): the router's count of its slots.
    pub slots: u32,
    /// Its workers' part: `Mixed`, or with `[disaggregation]` the pool they
    /// join (the groups are then ordered prefill first).
    pub role: Role,
}

/// Prompt and output tokens of the mean request when no stage says.
pub const DEFAULT_SHAPE: (f64, f64) = (1024.0, 256.0);

/// Resolves `file.worker_groups` over the spec's worker settings (`base`);
/// empty when the spec has none.
pub(super) fn resolve_groups(
    cx: &Ctx<'_>,
    file: &SpecFile,
    model: &ModelArch,
    stages: &[StageConfig],
    base: &WorkerConfig,
    base_dir: &Path,
) -> Result<Vec<Group>, ConfigError> {
    let sections = &file.worker_groups;
    if sections.is_empty() {
        if file.router.router_params.scale_group.is_some() {
            return Err(cx.err(
                "router.router_params.scale_group",
                "names a worker group, but the spec has no [[worker_groups]]",
                "remove scale_group (autoscaling adds workers like the others)",
            ));
        }
        return Ok(Vec::new());
    }
    if let Some(d) = &file.disaggregation
        && let Some((which, _)) =
            [("prefill", &d.prefill), ("decode", &d.decode)].into_iter().find(|(_, p)| p.is_some())
    {
        return Err(cx.err(
            &format!("disaggregation.{which}"),
            "with [[worker_groups]] the groups make the prefill and decode pools",
            "remove [disaggregation.prefill] and [disaggregation.decode], and give each group role = \"prefill\" or \"decode\"",
        ));
    }
    if file.simulation.num_workers != 1 {
        return Err(cx.err(
            "simulation.num_workers",
            "with [[worker_groups]] the groups' counts say how many workers there are",
            "remove simulation.num_workers, or drop [[worker_groups]]",
        ));
    }
    let shape = mean_shape(stages);
    let mut groups: Vec<Group> = Vec::with_capacity(sections.len());
    let mut total: u64 = 0;
    for (i, g) in sections.iter().enumerate() {
        let at = format!("worker_groups.{i}");
        let key = |k: &str| format!("{at}.{k}");
        if g.name.trim().is_empty() {
            return Err(cx.err(&key("name"), "a worker group needs a name", "e.g. name = \"h100\""));
        }
        if let Some(j) = groups.iter().position(|o| o.name == g.name) {
            return Err(cx.err(
                &key("name"),
                format!("worker_groups.{j} is also named {:?}", g.name),
                "give every group its own name",
            ));
        }
        let pool = resolve_pool(cx, file, &PoolKeys::from(g), &at, model, stages, base, base_dir)?;
        if pool.worker.max_model_len != base.max_model_len {
            return Err(cx.err(
                &key("vllm_params.max_model_len"),
                format!(
                    "{} tokens, but [worker]'s is {} (a request the router may send anywhere must fit everywhere)",
                    pool.worker.max_model_len, base.max_model_len
                ),
                "set max_model_len in [worker.vllm_params] for the whole fleet",
            ));
        }
        let hw = &file.worker.hw;
        let other_gpu = g.gpu.as_ref().is_some_and(|gpu| !gpu.eq_ignore_ascii_case(&hw.gpu));
        if other_gpu && hw.usd_per_gpu_hour.is_some() && g.usd_per_gpu_hour.is_none() {
            return Err(cx.err(
                &key("gpu"),
                format!("the group runs {} but would take [worker.hw]'s price, {}'s", pool.gpu.name, hw.gpu),
                format!("set {} (US dollars per GPU-hour)", key("usd_per_gpu_hour")),
            ));
        }
        let role = match (file.disaggregation.is_some(), g.role.as_deref().map(str::to_ascii_lowercase)) {
            (false, None) => Role::Mixed,
            (false, Some(_)) => {
                return Err(cx.err(
                    &key("role"),
                    "a group's role names its [disaggregation] pool, and the spec has none",
                    "remove role, or add [disaggregation] (its link and thresholds)",
                ));
            }
            (true, None) => {
                return Err(cx.err(
                    &key("role"),
                    "with [disaggregation] every worker group says which pool it joins",
                    "set role = \"prefill\" or role = \"decode\"",
                ));
            }
            (true, Some(r)) => match r.as_str() {
                "prefill" => Role::Prefill,
                "decode" => Role::Decode,
                other => {
                    return Err(cx
                        .err(&key("role"), format!("unknown role {other:?}"), "use prefill or decode")
                        .schema());
                }
            },
        };
        let capacity = match g.capacity {
            Some(c) => Some(cx.positive(&key("capacity"), c)?),
            None => None,
        };
        let slots = u32::try_from(concurrency(&pool.worker, shape)).unwrap_or(u32::MAX);
        total += u64::from(pool.count);
        groups.push(Group { name: g.name.clone(), capacity: capacity.unwrap_or(f64::NAN), pool, slots, role });
    }
    // Without prefill workers the groups serve requests whole (a sweep's baseline).
    if !groups.iter().any(|g| g.role == Role::Prefill && g.pool.count > 0) {
        groups.iter_mut().for_each(|g| g.role = Role::Mixed);
    }
    for g in &mut groups {
        if g.capacity.is_nan() {
            g.capacity = estimated_capacity(&g.pool.worker, shape, g.role);
        }
    }
    // The prefill pool is workers 0 … P − 1: prefill groups first, each role in the spec's order.
    groups.sort_by_key(|g| g.role != Role::Prefill);
    if let Some(name) = &file.router.router_params.scale_group
        && !groups.iter().any(|g| &g.name == name)
    {
        let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
        return Err(cx.err(
            "router.router_params.scale_group",
            format!("no worker group is named {name:?}"),
            format!("name one of the groups: {}", names.join(", ")),
        ));
    }
    let total = u32::try_from(total).unwrap_or(u32::MAX);
    cx.workers("worker_groups", total)?;
    if total == 0 {
        return Err(cx.err("worker_groups", "every worker group is empty", "give at least one group a count ≥ 1"));
    }
    Ok(groups)
}

/// Requests one worker of `cfg` runs at once, for requests of `(prompt,
/// output)` tokens: `max_num_seqs`, or as many as its KV pool holds at
/// their full length, if fewer (at least 1).
pub fn concurrency(cfg: &WorkerConfig, (prompt, output): (f64, f64)) -> u64 {
    let tokens = (prompt.round().max(1.0) + output.round().max(1.0)) as u64;
    u64::from(cfg.max_running).min(cfg.total_blocks * cfg.block_size / tokens).max(1)
}

/// Requests per second one worker of `cfg` serves at saturation, for
/// requests of `(prompt, output)` tokens: `1 / (T_prefill + output × T_decode / B)`,
/// where the prompt is prefilled in chunks of the token budget, and `B`
/// sequences ([`concurrency`]) decode together at the mean context
/// `prompt + output / 2`. Load-based routing divides a worker's load by it,
/// so a fleet of unequal workers is loaded in proportion to what each can
/// do (llm-d's and Dynamo's scorers likewise weigh a worker's queue
/// against its size). A closed form, not a simulation: it ignores prefix
/// hits and mixed steps, which change every group alike. A prefill
/// group's workers only prefill (`1 / T_prefill`), a decode group's only
/// decode (`B / (output × T_decode)`). With speculative decoding a decode
/// step is a verify, and emits the mean acceptance length per sequence.
pub fn estimated_capacity(cfg: &WorkerConfig, (prompt, output): (f64, f64), role: Role) -> f64 {
    let prompt = prompt.round().max(1.0) as u64;
    let output = output.round().max(1.0) as u64;
    let mut prefill = 0.0;
    let mut done = 0;
    while done < prompt {
        let end = prompt.min(done + cfg.token_budget.max(1));
        let chunk = [PrefillChunk { cached: done, end }];
        let samples = u64::from(end == prompt);
        let work = StepWork {
            prefill: &chunk,
            decodes: 0,
            drafts: 0,
            decode_context_tokens: 0,
            decode_window_tokens: 0,
            samples,
        };
        prefill += cfg.price(&work, |_| samples == 1).0.as_secs_f64();
        done = end;
    }
    let batch = concurrency(cfg, (prompt as f64, output as f64));
    let context = prompt + output / 2;
    let window = cfg.sliding_window.map_or(context, |w| context.min(w));
    // With speculative decoding a step verifies k drafts a sequence and
    // emits its mean acceptance length.
    let (k, emitted) = cfg.speculative.as_ref().map_or((0, 1.0), |sp| (sp.k, sp.mean_emitted()));
    let work = StepWork {
        drafts: k * batch,
        samples: (k + 1) * batch,
        ..StepWork::decode(batch, batch * context, batch * window)
    };
    let step = cfg.price(&work, |_| false).0.as_secs_f64();
    let decode = output as f64 * step / (batch as f64 * emitted);
    match role {
        Role::Mixed => 1.0 / (prefill + decode),
        Role::Prefill => 1.0 / prefill,
        Role::Decode => 1.0 / decode,
    }
}

/// The mean request's prompt and output tokens over the stages that say
/// (weighted by their requests where known), else [`DEFAULT_SHAPE`].
/// Distributions' means are taken from 4,096 draws of a fixed stream, so
/// the estimate is the same on every run of a spec.
pub fn mean_shape(stages: &[StageConfig]) -> (f64, f64) {
    let rng = || SeedTree::new(0).stream("capacity-shape");
    let mean = |d: &Dist| -> f64 {
        let mut r = rng();
        (0..4096).map(|_| f64::from(d.sample_tokens(&mut r))).sum::<f64>() / 4096.0
    };
    let (mut p, mut o, mut n) = (0.0, 0.0, 0.0);
    for st in stages {
        let (prompt, output) = match &st.kind {
            StageKind::Rate(s) => (mean(&s.prompt), mean(&s.output)),
            StageKind::Sc25(s) if !s.prompt_sizes.is_empty() => (
                s.prompt_sizes.iter().map(|&x| f64::from(x)).sum::<f64>() / s.prompt_sizes.len() as f64,
                f64::from(s.output_tokens),
            ),
            StageKind::Rag(s) => (s.prompt_tokens() as f64, mean(&s.output_tokens)),
            StageKind::VllmBench(s) if !s.requests.is_empty() => {
                let k = s.requests.len() as f64;
                (
                    s.requests.iter().map(|r| f64::from(r.prompt_tokens)).sum::<f64>() / k,
                    s.requests.iter().map(|r| f64::from(r.output_tokens)).sum::<f64>() / k,
                )
            }
            _ => continue,
        };
        let w = st.expected_requests().unwrap_or(1).max(1) as f64;
        (p, o, n) = (p + w * prompt, o + w * output, n + w);
    }
    if n > 0.0 { (p / n, o / n) } else { DEFAULT_SHAPE }
}
