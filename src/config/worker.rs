//! A worker's settings: its GPU, power model, step model (and the
//! operator profile it prices from) and its vLLM engine, resolved from the
//! spec. Used by the whole-spec resolution and by each P/D pool.

use super::context::Ctx;
use super::error::ConfigError;
use super::schema::{DEFAULT_BATCHED_TOKENS, InferenceParams, NumberOrString, SpecFile, SpeculativeParams, VllmParams};
use crate::time::SimDuration;
use crate::worker::data_parallel::{Backend, DataParallel, Exchange};
use crate::worker::model::{KvPool, ModelArch, Sharding, partition};
use crate::worker::perf::operators::{OperatorConstants, OperatorCurves, Operators};
use crate::worker::perf::profile::{Profile, Routing, aic::AicTables, analytic::Analytic, shipped, vidur};
use crate::worker::perf::{Coefficients, LatencyTable, MixRule, PrefillBatch, Roofline, StepModel};
use crate::worker::pipeline::Pipeline;
use crate::worker::power::PowerModel;
use crate::worker::presets::GpuSpec;
use crate::worker::speculative::{Drafter, Method, Speculative};
use crate::worker::{Scheduler, SlotMode, WorkerConfig};
use crate::workload::StageConfig;
use std::path::Path;

pub(super) fn resolve_gpu(cx: &Ctx<'_>, file: &SpecFile) -> Result<GpuSpec, ConfigError> {
    let hw = &file.worker.hw;
    let base = GpuSpec::preset(&hw.gpu);
    let pick = |key: &str, explicit: Option<f64>, preset: Option<f64>| -> Result<f64, ConfigError> {
        match explicit.or(preset) {
            Some(v) => cx.positive(key, v),
            None => Err(cx
                .err(
                    "worker.hw.gpu",
                    format!("unknown GPU {:?} and `{key}` is not set", hw.gpu),
                    format!("use a preset ({}) or set memory_gb, tflops and mem_bw_TBps", GpuSpec::preset_list()),
                )
                .schema()),
        }
    };
    let power = resolve_power(cx, hw, base.as_ref())?;
    let usd_per_hour = match hw.usd_per_gpu_hour {
        Some(p) if p.is_finite() && p >= 0.0 => Some(p),
        Some(p) => {
            return Err(cx.err(
                "worker.hw.usd_per_gpu_hour",
                format!("must be ≥ 0, got {p}"),
                "give a price in US dollars per GPU-hour, e.g. 2.5",
            ));
        }
        None => None,
    };
    let fp8 = match hw.tflops_fp8 {
        Some(v) => Some(cx.positive("worker.hw.tflops_fp8", v)?),
        None => base.as_ref().and_then(|g| g.fp8_tflops),
    };
    // Without a preset or a value: PCIe Gen4 ×16, the slowest interconnect a TP worker has.
    let link_gbps = match hw.link_GBps {
        Some(v) => cx.positive("worker.hw.link_GBps", v)?,
        None => base.as_ref().map_or(32.0, |g| g.link_gbps),
    };
    Ok(GpuSpec {
        name: base.as_ref().map_or_else(|| hw.gpu.clone(), |g| g.name.clone()),
        memory_gb: pick("worker.hw.memory_gb", hw.memory_gb, base.as_ref().map(|g| g.memory_gb))?,
        tflops: pick("worker.hw.tflops", hw.tflops, base.as_ref().map(|g| g.tflops))?,
        mem_bw_tbps: pick("worker.hw.mem_bw_TBps", hw.mem_bw_TBps, base.as_ref().map(|g| g.mem_bw_tbps))?,
        fp8_tflops: fp8,
        link_gbps,
        power,
        usd_per_hour,
    })
}

/// The power model: the preset's (measured, or shares of its maximum),
/// with the spec's overrides; a `max_watts` given for a GPU without measured
/// power scales its shares.
fn resolve_power(
    cx: &Ctx<'_>,
    hw: &super::schema::HwParams,
    base: Option<&GpuSpec>,
) -> Result<PowerModel, ConfigError> {
    let max_w = match hw.max_watts {
        Some(w) => cx.positive("worker.hw.max_watts", w)?,
        None => base.map_or(0.0, |g| g.power.max_w),
    };
    let mut p = match base {
        Some(g) if hw.max_watts.is_none() => g.power,
        _ => PowerModel::from_shares(max_w, crate::worker::power::SHARES),
    };
    let watts = |key: &str, v: Option<f64>, default: f64| -> Result<f64, ConfigError> {
        match v {
            Some(w) if w.is_finite() && w >= 0.0 => Ok(w),
            Some(w) => Err(cx.err(key, format!("must be ≥ 0 W, got {w}"), "give watts per GPU, e.g. 190")),
            None => Ok(default),
        }
    };
    p.idle_w = watts("worker.hw.idle_watts", hw.idle_watts, p.idle_w)?;
    p.active_w = watts("worker.hw.active_watts", hw.active_watts, p.active_w)?;
    p.compute_w = watts("worker.hw.compute_watts", hw.compute_watts, p.compute_w)?;
    p.memory_w = watts("worker.hw.memory_watts", hw.memory_watts, p.memory_w)?;
    for (key, w) in [("worker.hw.idle_watts", p.idle_w), ("worker.hw.active_watts", p.active_w)] {
        if max_w > 0.0 && w > max_w {
            return Err(cx.err(
                key,
                format!("{w} W, above the board's {max_w} W at full use"),
                "give idle_watts and active_watts at most max_watts (the preset's maximum unless set)",
            ));
        }
    }
    Ok(p)
}

fn parse_coefficient(cx: &Ctx<'_>, key: &str, v: &NumberOrString) -> Result<f64, ConfigError> {
    let x = match v {
        NumberOrString::Number(x) => *x,
        NumberOrString::String(s) => {
            s.trim().parse().map_err(|_| cx.err(key, format!("{s:?} is not a number"), "write a number such as 4"))?
        }
    };
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(cx.err(key, format!("must be a non-negative number, got {x}"), "use Opal's defaults a = 4, b = 24"))
    }
}

/// `worker.hw.ep`, checked: 1, or every GPU the experts span for a
/// mixture of experts — the worker's `tp`, or with data-parallel attention
/// over `dp` ranks `dp × tp` (vLLM's `--enable-expert-parallel` shards the
/// experts over the TP ranks, and with `--data-parallel-size` over every
/// rank's: `FusedMoEParallelConfig.make`, `ep_size = dp_size × tp_size`).
fn expert_parallel(cx: &Ctx<'_>, ep: u32, model: &ModelArch, tp: u32, pp: u32, dp: u32) -> Result<u32, ConfigError> {
    let key = "worker.hw.ep";
    let all = tp * dp;
    match ep {
        1 => Ok(1),
        _ if model.moe.is_none() => {
            Err(cx.err(key, format!("{} has no experts to shard", model.name), "remove ep (or set it to 1)"))
        }
        _ if pp > 1 => Err(cx.err(
            key,
            "expert parallelism with pipeline stages is not modelled yet",
            "set ep = 1, or pp = 1",
        )),
        _ if ep == all => Ok(ep),
        _ if dp > 1 => Err(cx.err(
            key,
            format!("ep = {ep} with tp = {tp} and dp_attention = {dp}: vLLM shards the experts over every rank's GPUs, so ep is dp_attention × tp"),
            format!("set ep = {all} (or 1: every expert split over the {all} GPUs)"),
        )),
        _ => Err(cx.err(
            key,
            format!("ep = {ep} with tp = {tp}: without data-parallel attention vLLM shards the experts over the TP ranks, so ep is tp"),
            format!("set ep = {tp} (or 1: every expert split over the TP ranks)"),
        )),
    }
}

/// `worker.hw.dp_attention` and its keys, checked: `None` when off (1).
/// Data-parallel attention is modelled for a mixture of experts on the v1
/// scheduler and the operators step model (which prices the routed experts
/// apart), without pipeline stages or speculative decoding.
#[allow(clippy::too_many_arguments)]
fn data_parallel(
    cx: &Ctx<'_>,
    file: &SpecFile,
    model: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    pp: u32,
    speculative: bool,
    max_num_seqs: u32,
    scheduler: Scheduler,
) -> Result<Option<DataParallel>, ConfigError> {
    let hw = &file.worker.hw;
    let key = "worker.hw.dp_attention";
    let dp = cx.at_least(key, i64::from(hw.dp_attention), 1)?;
    if dp == 1 {
        for (k, set) in [("dp_link_GBps", hw.dp_link_GBps.is_some()), ("all2all_backend", hw.all2all_backend.is_some())]
        {
            if set {
                return Err(cx.err(
                    &format!("worker.hw.{k}"),
                    format!("`{k}` applies to data-parallel attention, which is off (dp_attention = 1)"),
                    format!("set dp_attention to the ranks stepping together, or remove `{k}`"),
                ));
            }
        }
        return Ok(None);
    }
    let Some(moe) = &model.moe else {
        return Err(cx.err(
            key,
            format!(
                "{} is dense: its data-parallel ranks do not step together (vLLM runs them as independent engines)",
                model.name
            ),
            "model them as workers (simulation.num_workers), and remove dp_attention",
        ));
    };
    let refuse =
        |why: &str, fix: &str| Err(cx.err(key, format!("data-parallel attention with {why} is not modelled"), fix));
    if pp > 1 {
        return refuse("pipeline stages", "set pp = 1, or dp_attention = 1");
    }
    if speculative {
        return refuse(
            "speculative decoding",
            "remove [worker.speculative] (or method = \"none\"), or set dp_attention = 1",
        );
    }
    if scheduler == Scheduler::V0 {
        return refuse(
            "the v0 scheduler",
            "set worker.vllm_params.scheduler = \"v1\" (vLLM's data-parallel ranks run the v1 engine)",
        );
    }
    if !file.worker.inference_params.model.eq_ignore_ascii_case("operators") {
        return refuse(
            &format!("the {} step model", file.worker.inference_params.model),
            "use the operators step model (the default), which prices the routed experts over every rank's tokens",
        );
    }
    let backend = match &hw.all2all_backend {
        None => Backend::AllgatherReducescatter,
        Some(name) => Backend::parse(name).ok_or_else(|| {
            cx.err(
                "worker.hw.all2all_backend",
                format!("unknown backend {name:?}"),
                format!("use one of {}", Backend::NAMES.join(", ")),
            )
            .schema()
        })?,
    };
    // One 8-GPU node: the ranks talk over the TP link (NVLink); across
    // nodes, one 400 Gb/s NIC per GPU.
    let one_node = u64::from(tp) * u64::from(dp) <= 8;
    let link = match hw.dp_link_GBps {
        None if one_node => gpu.link_gbps,
        None => 50.0,
        Some(x) => cx.positive("worker.hw.dp_link_GBps", x)?,
    };
    Ok(Some(DataParallel {
        ranks: dp,
        // vLLM's `max_cudagraph_capture_size` default (`vllm/config/compilation.py`).
        graph_tokens: (2 * u64::from(max_num_seqs)).min(512),
        exchange: Exchange {
            backend,
            moe_layers: moe.layers as f64,
            hidden: model.hidden_size,
            experts: moe.experts,
            topk: moe.active,
            ranks: u64::from(dp),
            tp: u64::from(tp),
            act_bytes: model.dtype_bytes as f64,
            link_bytes_per_s: link * 1e9,
        },
    }))
}

fn resolve_perf(
    cx: &Ctx<'_>,
    ip: &InferenceParams,
    model: &ModelArch,
    gpu: &GpuSpec,
    sharding: Sharding,
    base_dir: &Path,
) -> Result<StepModel, ConfigError> {
    let (tp, ep, dp) = (sharding.tp, sharding.ep, sharding.dp);
    let key = |k: &str| format!("worker.inference_params.{k}");
    let name = ip.model.to_ascii_lowercase();
    if !["operators", "roofline", "synthetic", "table"].contains(&name.as_str()) {
        return Err(cx
            .err(
                &key("model"),
                format!("unknown step-time model {:?}", ip.model),
                "use operators (the default), roofline (Opal's), synthetic or table",
            )
            .schema());
    }
    if let Some((k, models)) = ip.foreign_keys().into_iter().next() {
        return Err(cx.err(
            &key(k),
            format!("`{k}` belongs to the {} step model, and this one is {name}", models.join(" and ")),
            format!("remove `{k}`, or set model = \"{}\"", models[0]),
        ));
    }
    let mix = |default: MixRule| -> Result<MixRule, ConfigError> {
        match ip.mixed_step.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => Ok(default),
            Some("max") => Ok(MixRule::Max),
            Some("sum") => Ok(MixRule::Sum),
            Some(other) => {
                Err(cx.err(&key("mixed_step"), format!("unknown rule {other:?}"), "use `max` (Opal) or `sum`").schema())
            }
        }
    };
    let non_negative = |k: &str, v: Option<f64>, default: f64| -> Result<f64, ConfigError> {
        match v {
            None => Ok(default),
            Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
            Some(x) => Err(cx.err(
                &key(k),
                format!("must be a finite number ≥ 0, got {x}"),
                "`opal-sweep calibrate` fits it to measured step times",
            )),
        }
    };
    Ok(match name.as_str() {
        "operators" => {
            let scale = |k: &str, v: Option<f64>| -> Result<f64, ConfigError> {
                match v {
                    None => Ok(1.0),
                    Some(x) if x.is_finite() && x > 0.0 => Ok(x),
                    Some(x) => Err(cx.err(
                        &key(k),
                        format!("must be a finite number > 0, got {x}"),
                        "1 prices operators as the profile does; `opal-sweep calibrate` fits it",
                    )),
                }
            };
            let constants = OperatorConstants {
                compute_scale: scale("compute_scale", ip.compute_scale)?,
                memory_scale: scale("memory_scale", ip.memory_scale)?,
                comm_scale: scale("comm_scale", ip.comm_scale)?,
                step_overhead_s: non_negative("step_overhead_secs", ip.step_overhead_secs, 0.0)?,
                seq_overhead_s: non_negative("seq_overhead_secs", ip.seq_overhead_secs, 0.0)?,
                prefill_overhead_s: non_negative("prefill_overhead_secs", ip.prefill_overhead_secs, 0.0)?,
            };
            let routing = match ip.expert_routing.as_deref() {
                None => Routing::default(),
                Some(name) => Routing::parse(name).ok_or_else(|| {
                    cx.err(
                        &key("expert_routing"),
                        format!("unknown routing {name:?}"),
                        "use `balanced` (the default), `power_law_1.01` or `power_law_1.2` (the distributions aiconfigurator's MoE tables measure)",
                    )
                })?,
            };
            let (profile, id) = resolve_profile(cx, ip.profile.as_deref(), model, gpu, tp, base_dir, routing)?;
            let cache_key = format!("{id}|tp {tp}|ep {ep}|dp {dp}|{:?}|{:?}", gpu.peaks(), model);
            StepModel::Operators(Operators {
                curves: OperatorCurves::cached(cache_key, model, sharding, &profile),
                constants,
            })
        }
        "roofline" => {
            let efficiency = ip.decode_bw_efficiency.unwrap_or(1.0);
            if !(efficiency > 0.0 && efficiency <= 1.0) {
                return Err(cx.err(
                    &key("decode_bw_efficiency"),
                    format!("must be in (0, 1], got {efficiency}"),
                    "1 is the datasheet bandwidth",
                ));
            }
            let four = NumberOrString::Number(4.0);
            let twenty_four = NumberOrString::Number(24.0);
            let c = Coefficients {
                a: parse_coefficient(cx, &key("a"), ip.a.as_ref().unwrap_or(&four))?,
                b: parse_coefficient(cx, &key("b"), ip.b.as_ref().unwrap_or(&twenty_four))?,
                decode_bw_efficiency: efficiency,
                step_overhead_secs: non_negative("step_overhead_secs", ip.step_overhead_secs, 0.0)?,
            };
            let mut roofline = Roofline::new(model, gpu, tp, c);
            roofline.prefill_batch = match ip.prefill_batch.as_deref().map(str::to_ascii_lowercase).as_deref() {
                None | Some("sum") => PrefillBatch::Sum,
                Some("max") => PrefillBatch::Max,
                Some(other) => {
                    return Err(cx
                        .err(&key("prefill_batch"), format!("unknown rule {other:?}"), "use `sum` or `max` (Opal)")
                        .schema());
                }
            };
            StepModel::Roofline(roofline, mix(MixRule::Max)?)
        }
        "synthetic" => StepModel::Synthetic(SimDuration::from_secs_f64(
            cx.positive(&key("mean_latency_secs"), ip.mean_latency_secs.unwrap_or(1.0))?,
        )),
        _ => {
            let k = key("table_path");
            let path = ip.table_path.as_ref().ok_or_else(|| {
                cx.err(&k, "the `table` model needs a CSV of latencies", "set table_path = \"path/to/latencies.csv\"")
            })?;
            StepModel::Table(
                LatencyTable::from_csv(&base_dir.join(path))
                    .map_err(|e| cx.err(&k, e, "columns: phase,batch_size,tokens,latency_ms"))?,
                mix(MixRule::Sum)?,
            )
        }
    })
}

/// Where the `operators` model's prices come from (`profile`), and a name
/// for it that tells configurations apart (the curves' memo key).
fn resolve_profile(
    cx: &Ctx<'_>,
    profile: Option<&str>,
    model: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    base_dir: &Path,
    routing: Routing,
) -> Result<(Profile, String), ConfigError> {
    let key = "worker.inference_params.profile";
    let analytic = Analytic { peaks: gpu.peaks() };
    // Shipped tables describe the preset's GPU: they hold utilisation against its own peaks.
    let shipped = || GpuSpec::preset(&gpu.name).and_then(|p| shipped::tables(&p.name, p.peaks()));
    let profile = match profile.unwrap_or("auto") {
        "auto" => Profile { vidur: None, tables: shipped(), analytic, routing },
        "analytic" => Profile { vidur: None, tables: None, analytic, routing },
        dir => {
            let path = base_dir.join(dir);
            if !path.is_dir() {
                return Err(cx.err(
                    key,
                    format!("{} is not a directory", path.display()),
                    "use auto, analytic, or a directory of aiconfigurator tables (gemm_perf.parquet, …) or a Vidur profile (mlp.csv)",
                ));
            }
            if path.join("mlp.csv").is_file() {
                let (heads, kv_heads) = match model.attention {
                    crate::worker::model::Attention::Gqa { heads, kv_heads, .. } => (heads, kv_heads),
                    crate::worker::model::Attention::Mla { .. } => {
                        return Err(cx.err(
                            key,
                            "a Vidur profile prices only grouped-query attention models",
                            "use auto or analytic for MLA models",
                        ));
                    }
                };
                let shape = vidur::VidurShape {
                    heads,
                    kv_heads,
                    hidden: model.hidden_size,
                    intermediate: model.intermediate_size,
                    tp,
                };
                let v = vidur::VidurProfile::from_dir(&path, shape).map_err(|e| {
                    cx.err(key, e, "profile the model at this tensor-parallel degree with Vidur, or use auto")
                })?;
                Profile { vidur: Some(std::sync::Arc::new(v)), tables: shipped(), analytic, routing }
            } else {
                let t = AicTables::from_dir(&path, gpu.peaks()).map_err(|e| cx.err(key, e, "give a directory of tables in aiconfigurator's format (gemm_perf.parquet, and its attention and all-reduce tables; any Parquet codec): correct or remove a row the message names (sizes at least 1, latencies in milliseconds)"))?;
                Profile { vidur: None, tables: Some(std::sync::Arc::new(t)), analytic, routing }
            }
        }
    };
    let id = profile.describe();
    Ok((profile, id))
}

pub(super) fn resolve_worker(
    cx: &Ctx<'_>,
    file: &SpecFile,
    model: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    stages: &[StageConfig],
    base_dir: &Path,
) -> Result<WorkerConfig, ConfigError> {
    if let Some(why) = model.tp_problem(u64::from(tp)) {
        return Err(cx.err("worker.hw.tp", why, "use a degree that divides the head count"));
    }
    let v = &file.worker.vllm_params;
    let key = |k: &str| format!("worker.vllm_params.{k}");
    let max_num_seqs = cx.at_least(&key("max_num_seqs"), i64::from(v.max_num_seqs), 1)?;
    let block_size = cx.at_least(&key("block_size"), i64::from(v.block_size), 1)?;
    let util = v.gpu_memory_utilization;
    if !(util > 0.0 && util <= 1.0) {
        return Err(cx.err(
            &key("gpu_memory_utilization"),
            format!("must be in (0, 1], got {util}"),
            "vLLM's default is 0.9",
        ));
    }
    let slots = &file.worker.slots;
    let io_slots =
        cx.at_least("worker.slots.io_slots", i64::from(slots.io_slots.unwrap_or(v.max_kvc_ready_requests)), 1)?;
    let gpu_slots = cx.at_least("worker.slots.gpu_slots", i64::from(slots.gpu_slots.unwrap_or(max_num_seqs)), 1)?;
    let slot_mode = match slots.mode.to_ascii_lowercase().as_str() {
        "pipelined" => SlotMode::Pipelined,
        "single_stage" => SlotMode::SingleStage,
        other => {
            return Err(cx
                .err("worker.slots.mode", format!("unknown slot mode {other:?}"), "use `pipelined` or `single_stage`")
                .schema());
        }
    };

    let hw = &file.worker.hw;
    let pp = cx.at_least("worker.hw.pp", i64::from(hw.pp), 1)?;
    if u64::from(pp) > model.num_layers {
        return Err(cx.err(
            "worker.hw.pp",
            format!(
                "{} has {} layers, which {pp} pipeline stages cannot split (each needs one)",
                model.name, model.num_layers
            ),
            format!("use at most {} stages", model.num_layers),
        ));
    }
    // Parsed once, before the checks of data-parallel attention and
    // speculative decoding that refuse the v0 scheduler.
    let scheduler = match v.scheduler.to_ascii_lowercase().as_str() {
        "v1" => Scheduler::V1,
        "v0" => Scheduler::V0,
        other => {
            return Err(cx.err(&key("scheduler"), format!("unknown scheduler {other:?}"), "use v1 or v0").schema());
        }
    };
    let speculating = file.worker.speculative.as_ref().is_some_and(|sp| !sp.method.eq_ignore_ascii_case("none"));
    let data_parallel = data_parallel(cx, file, model, gpu, tp, pp, speculating, max_num_seqs, scheduler)?;
    let dp = data_parallel.as_ref().map_or(1, |d| d.ranks);
    let ep = expert_parallel(cx, hw.ep, model, tp, pp, dp)?;
    let sharding = Sharding { tp, ep, dp };
    let layers = partition(model.num_layers, u64::from(pp));
    let speculative = match &file.worker.speculative {
        // `none` switches it off, so that an axis can compare with and without.
        Some(sp) if !sp.method.eq_ignore_ascii_case("none") => {
            Some(resolve_speculative(cx, file, sp, model, gpu, (tp, ep), (pp, scheduler), base_dir)?)
        }
        _ => None,
    };
    let (draft_weights, draft_kv) = speculative.as_ref().map_or((0, 0), |(_, w, kv)| (*w, *kv));
    let pool = KvPool::staged(model, gpu.memory_gb, tp, util, block_size as u64, &layers)
        .with_experts_over(model, sharding)
        .with_drafter(draft_weights, draft_kv, block_size as u64);
    let fit_hint = "use more GPUs per worker (worker.hw.tp, or pipeline stages: worker.hw.pp), a GPU with more memory, a smaller model, or a higher gpu_memory_utilization";
    if !pool.fits() {
        let (of, what) = if pp > 1 { (" a stage", " per stage") } else { ("", "") };
        return Err(cx.err(
            "worker.hw",
            format!(
                "the model does not fit in GPU memory: {} needs {:.1} GiB of weights{of} but {} × {} at gpu_memory_utilization {util} leaves {:.1} GiB{what}",
                model.name,
                pool.weight_bytes / (1u64 << 30) as f64,
                tp,
                gpu.name,
                pool.memory_bytes / (1u64 << 30) as f64
            ),
            fit_hint,
        ));
    }
    // The engine's own count when given (vLLM's --num-gpu-blocks-override), else the arithmetic.
    let total_blocks = match v.num_gpu_blocks_override {
        Some(0) => {
            return Err(cx.err(
                &key("num_gpu_blocks_override"),
                "must be at least 1 block",
                "copy \"# GPU blocks\" from the vLLM server's log, or leave it unset to compute the pool from memory",
            ));
        }
        Some(n) => n,
        None => pool.blocks,
    };
    let max_model_len = match v.max_model_len {
        None => model.max_model_len,
        Some(0) => {
            return Err(cx.err(
                &key("max_model_len"),
                "must be at least 1",
                "leave it unset for the model's context length",
            ));
        }
        Some(n) if n > model.max_model_len && !v.allow_long_max_model_len => {
            return Err(cx.err(
                &key("max_model_len"),
                format!("{n} is longer than {}'s context length ({})", model.name, model.max_model_len),
                format!(
                    "use at most {}, or set allow_long_max_model_len = true (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN)",
                    model.max_model_len
                ),
            ));
        }
        Some(n) => n,
    };
    let budget = token_budget(cx, v, max_model_len, max_num_seqs)?;
    let longest = stages.iter().filter_map(StageConfig::max_sequence_tokens).max().unwrap_or(0);
    if longest > max_model_len {
        return Err(cx.err(
            "workload.stages",
            format!(
                "a request can reach {longest} tokens (prompt + output) but the engine serves at most {max_model_len}"
            ),
            "lower prompt_size_max or output_tokens_max, or raise worker.vllm_params.max_model_len",
        ));
    }
    // As vLLM at start-up: one sequence of max_model_len tokens must fit.
    let needed = max_model_len.div_ceil(u64::from(block_size));
    if total_blocks < needed && v.num_gpu_blocks_override.is_some() {
        return Err(cx.err(
            &key("num_gpu_blocks_override"),
            format!(
                "one maximum-length sequence ({max_model_len} tokens = {needed} blocks of {block_size}) does not fit in {total_blocks} blocks"
            ),
            "give the engine's block count (vLLM refuses to start with fewer than one sequence's), or a smaller worker.vllm_params.max_model_len",
        ));
    }
    if total_blocks < needed {
        return Err(cx.err(
            "worker.hw",
            format!(
                "one maximum-length sequence ({max_model_len} tokens = {needed} blocks of {block_size}) does not fit in the KV cache ({total_blocks} blocks left after {:.1} GiB of weights)",
                pool.weight_bytes / (1u64 << 30) as f64
            ),
            format!("{fit_hint}, or a smaller worker.vllm_params.max_model_len"),
        ));
    }
    if !(v.apc_lru_ttl.is_finite() && v.apc_lru_ttl >= 0.0) {
        return Err(cx.err(
            &key("apc_lru_ttl"),
            format!("must be ≥ 0 seconds, got {}", v.apc_lru_ttl),
            "use 0 for plain LRU",
        ));
    }
    let chunked_prefill = v.chunked_prefill;
    let pipeline = match pp {
        1 => None,
        _ if scheduler == Scheduler::V0 => {
            return Err(cx.err(
                "worker.hw.pp",
                "pipeline parallelism is modelled with the v1 scheduler (vLLM v0's virtual engines are not)",
                "set worker.vllm_params.scheduler = \"v1\", or pp = 1",
            ));
        }
        _ => {
            let gbps = |k: &str, v: Option<f64>, default: f64| -> Result<f64, ConfigError> {
                v.map_or(Ok(default), |x| cx.positive(&format!("worker.hw.{k}"), x))
            };
            // One 8-GPU node: the stages talk over the TP link (NVLink);
            // across nodes, one 400 Gb/s NIC per GPU.
            let one_node = u64::from(tp) * u64::from(pp) <= 8;
            let link = gbps("pp_link_GBps", hw.pp_link_GBps, if one_node { gpu.link_gbps } else { 50.0 })?;
            let latency_us = match hw.pp_link_latency_us {
                None => 10.0,
                Some(x) if x.is_finite() && x >= 0.0 => x,
                Some(x) => {
                    return Err(cx.err(
                        "worker.hw.pp_link_latency_us",
                        format!("must be ≥ 0 µs, got {x}"),
                        "the default is 10",
                    ));
                }
            };
            Some(Pipeline {
                layers,
                micro_budget: budget,
                chunked_prefill,
                bytes_per_token: (2 * model.hidden_size * model.dtype_bytes) as f64,
                tp,
                link_bytes_per_s: link * 1e9,
                tp_link_bytes_per_s: gpu.link_gbps * 1e9,
                hop_latency_s: latency_us * 1e-6,
            })
        }
    };
    Ok(WorkerConfig {
        max_running: max_num_seqs.min(gpu_slots),
        scheduler,
        // vLLM v0's BlockSpaceManager keeps 1 % of the blocks free when it
        // admits a prompt (`watermark = 0.01`, `can_allocate`).
        admission_watermark: match scheduler {
            Scheduler::V1 => 0,
            Scheduler::V0 => total_blocks / 100,
        },
        // With pipeline stages a step is a round of up to `pp` micro-batches, each within the budget.
        token_budget: budget * u64::from(pp),
        chunked_prefill,
        block_size: u64::from(block_size),
        total_blocks,
        io_slots,
        slot_mode,
        max_model_len,
        prefix_caching: v.enable_prefix_caching,
        apc_ttl: SimDuration::from_secs_f64(v.apc_lru_ttl),
        event_stride: 1,
        report_evictions: false,
        publish_events: false,
        perf: resolve_perf(cx, &file.worker.inference_params, model, gpu, sharding, base_dir)?,
        usage: Roofline::new(model, gpu, tp, Coefficients::OPAL),
        sliding_window: model.window.map(|(w, _)| w),
        power: gpu.power,
        pipeline,
        speculative: speculative.map(|(s, ..)| s),
        data_parallel,
    })
}

/// `[worker.speculative]`: the method, k, the acceptance, and the drafter
/// priced as the target is (its weights and KV bytes per token beside).
#[allow(clippy::too_many_arguments)]
fn resolve_speculative(
    cx: &Ctx<'_>,
    file: &SpecFile,
    sp: &SpeculativeParams,
    model: &ModelArch,
    gpu: &GpuSpec,
    (tp, ep): (u32, u32),
    (pp, scheduler): (u32, Scheduler),
    base_dir: &Path,
) -> Result<(Speculative, u64, u64), ConfigError> {
    let key = |k: &str| format!("worker.speculative.{k}");
    let method = Method::parse(&sp.method).ok_or_else(|| {
        cx.err(
            &key("method"),
            format!("unknown speculative method {:?}", sp.method),
            "use ngram, eagle, mtp or draft_model (vLLM's speculative_config.method), or none (off)",
        )
        .schema()
    })?;
    // vLLM accepts any k; past 16 drafts the acceptance of the last is nil in practice.
    let k = u64::from(sp.num_speculative_tokens);
    if !(1..=16).contains(&k) {
        return Err(cx.err(
            &key("num_speculative_tokens"),
            format!("must be an integer from 1 to 16, got {k}"),
            "vLLM's examples use 2 to 5 (EAGLE) and up to 5 (ngram)",
        ));
    }
    let rate_ok = |x: f64| x.is_finite() && (0.0..=1.0).contains(&x);
    let at_least = match (sp.acceptance_rate, &sp.acceptance_rates) {
        (Some(a), None) if rate_ok(a) => (1..=k).map(|j| a.powi(j as i32)).collect(),
        (Some(a), None) => {
            return Err(cx.err(&key("acceptance_rate"), format!("must be in [0, 1], got {a}"), "a probability α"));
        }
        (None, Some(rates)) => {
            if rates.len() as u64 != k {
                return Err(cx.err(
                    &key("acceptance_rates"),
                    format!("has {} values but num_speculative_tokens is {k}", rates.len()),
                    "give one rate per draft position",
                ));
            }
            if let Some(bad) = rates.iter().find(|&&x| !rate_ok(x)) {
                return Err(cx.err(
                    &key("acceptance_rates"),
                    format!("{bad} is not in [0, 1]"),
                    "rates are shares of drafts",
                ));
            }
            if rates.windows(2).any(|w| w[1] > w[0]) {
                return Err(cx.err(
                    &key("acceptance_rates"),
                    format!("{rates:?} rises: a position is accepted only if every one before it was"),
                    "give vLLM's per-position acceptance (accepted at position j / drafts), which never rises",
                ));
            }
            rates.clone()
        }
        (Some(_), Some(_)) => {
            return Err(cx.err(
                &key("acceptance_rate"),
                "both acceptance_rate and acceptance_rates are set",
                "keep one: α for every position, or the per-position list",
            ));
        }
        (None, None) => {
            return Err(cx.err(
                &key("acceptance_rate"),
                "speculative decoding needs its acceptance",
                "set acceptance_rate = α (e.g. 0.7), or acceptance_rates = [one per position] from vLLM's spec_decode metrics",
            ));
        }
    };
    let draft_keys = sp.draft_model.is_some() || sp.draft_config_path.is_some();
    if method != Method::DraftModel && draft_keys {
        return Err(cx.err(
            &key(if sp.draft_model.is_some() { "draft_model" } else { "draft_config_path" }),
            format!("a draft model belongs to method = \"draft_model\", and this one is {}", sp.method),
            "remove it, or set method = \"draft_model\"",
        ));
    }
    let refuse = |k: &str, why: &str, fix: &str| Err(cx.err(k, why.to_string(), fix.to_string()));
    if pp > 1 {
        return refuse(
            &key("method"),
            "speculative decoding with pipeline stages is not modelled",
            "set worker.hw.pp = 1",
        );
    }
    if scheduler == Scheduler::V0 {
        return refuse(
            &key("method"),
            "speculative decoding is modelled on vLLM v1's scheduler",
            "set worker.vllm_params.scheduler = \"v1\"",
        );
    }
    let ip = &file.worker.inference_params;
    let kind = ip.model.to_ascii_lowercase();
    if kind == "table" {
        return refuse(
            &key("method"),
            "a table of measured step latencies cannot price a verify of k + 1 tokens per sequence",
            "use the operators or roofline model (or measure with speculative decoding on and drop [worker.speculative])",
        );
    }
    // The drafter: none, the model's own head, or another model.
    let (drafter_arch, weights) = match method {
        Method::Ngram => (None, 0),
        Method::Eagle | Method::Mtp => {
            let (head, bytes) = model.draft_head();
            (Some(head), bytes)
        }
        Method::DraftModel => {
            let draft = match (&sp.draft_model, &sp.draft_config_path) {
                (Some(_), Some(_)) => {
                    return refuse(
                        &key("draft_config_path"),
                        "both draft_model and draft_config_path name the draft model",
                        "keep one: a preset (draft_model) or a config.json (draft_config_path)",
                    );
                }
                (None, Some(path)) => ModelArch::from_hf_config(&base_dir.join(path)).map_err(|e| {
                    cx.err(&key("draft_config_path"), e, "point it at the draft model's Hugging Face config.json")
                })?,
                (Some(name), None) => ModelArch::preset(name).ok_or_else(|| {
                    cx.err(
                        &key("draft_model"),
                        format!("unknown model {name:?}"),
                        format!("use a preset ({}) or draft_config_path", ModelArch::preset_list()),
                    )
                })?,
                (None, None) => {
                    return refuse(
                        &key("draft_model"),
                        "method = \"draft_model\" needs the draft model",
                        "set draft_model = a preset, or draft_config_path = its config.json",
                    );
                }
            };
            let draft_key = key(if sp.draft_config_path.is_some() { "draft_config_path" } else { "draft_model" });
            if draft.vocab_size != model.vocab_size {
                return Err(cx.err(
                    &draft_key,
                    format!(
                        "{} has a vocabulary of {} tokens and {} of {}: drafts must be the target's tokens",
                        draft.name, draft.vocab_size, model.name, model.vocab_size
                    ),
                    "use a draft model of the target's family (e.g. llama-3.1-8b for llama-3.1-70b)",
                ));
            }
            if let Some(why) = draft.tp_problem(u64::from(tp)) {
                return Err(cx.err(
                    &draft_key,
                    format!("the draft model at TP {tp}: {why}"),
                    "use a draft model whose heads split over the TP GPUs",
                ));
            }
            let bytes = draft.weight_bytes();
            (Some(draft), bytes)
        }
    };
    // The drafter's KV is kept as the target's is (`--kv-cache-dtype`).
    let drafter_arch = drafter_arch.map(|mut arch| {
        arch.kv_dtype_bytes = model.kv_dtype_bytes;
        arch
    });
    let kv = drafter_arch.as_ref().map_or(0, |a| a.kv_bytes_per_token_of(a.num_layers, u64::from(tp)));
    let drafter = match drafter_arch {
        // A synthetic step takes its fixed time, drafts and all.
        Some(arch) if kind != "synthetic" => {
            let draft_ep = if arch.moe.is_some() { ep } else { 1 };
            let perf =
                resolve_perf(cx, ip, &arch, gpu, Sharding { tp, ep: draft_ep, dp: 1 }, base_dir)?.without_overheads();
            Some(Drafter { perf, usage: Roofline::new(&arch, gpu, tp, Coefficients::OPAL) })
        }
        _ => None,
    };
    Ok((Speculative { method, k, at_least, drafter }, weights, kv))
}

/// The step token budget, as vLLM sets and checks it
/// (`vllm/config/scheduler.py`, `SchedulerConfig.__post_init__` and
/// `_verify_args`, v0.11; `vllm/config.py` L2022–2031 in v0.8.5): unset, it is
/// 8,192 with chunked prefill and `max(max_model_len, 8192)` without; it must
/// hold a full batch of decodes, and without chunked prefill a whole prompt of
/// `max_model_len` tokens, since a prompt is then prefilled in one step.
fn token_budget(cx: &Ctx<'_>, v: &VllmParams, max_model_len: u64, max_num_seqs: u32) -> Result<u64, ConfigError> {
    let key = "worker.vllm_params.max_num_batched_tokens";
    let budget = match v.max_num_batched_tokens {
        Some(b) => u64::from(cx.at_least(key, i64::from(b), 1)?),
        None if v.chunked_prefill => u64::from(DEFAULT_BATCHED_TOKENS),
        None => max_model_len.max(u64::from(DEFAULT_BATCHED_TOKENS)),
    };
    if budget < u64::from(max_num_seqs) {
        return Err(cx.err(
            key,
            format!("max_num_batched_tokens ({budget}) is smaller than max_num_seqs ({max_num_seqs}), so a full batch of decodes could not run"),
            "make max_num_batched_tokens ≥ max_num_seqs (vLLM requires it)",
        ));
    }
    if !v.chunked_prefill && budget < max_model_len {
        return Err(cx.err(
            key,
            format!(
                "max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}). This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences"
            ),
            "increase max_num_batched_tokens or decrease worker.vllm_params.max_model_len, or turn chunked_prefill on",
        ));
    }
    Ok(budget)
}
