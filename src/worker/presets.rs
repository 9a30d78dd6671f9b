//! Presets: models — their published Hugging Face `config.json`, shipped in
//! `models/` (with where each came from) and read by the same code as a
//! user's — and GPUs, with their vendors' datasheet numbers.

use super::model::{ModelArch, config};
use super::perf::profile::Peaks;
use super::power::{self, PowerModel};
use std::path::Path;

/// A model preset: its name, other names it answers to, its `config.json`.
struct ModelPreset {
    name: &'static str,
    aliases: &'static [&'static str],
    config: &'static str,
}

macro_rules! preset {
    ($name:literal, $file:literal, [$($alias:literal),*]) => {
        ModelPreset { name: $name, aliases: &[$($alias),*], config: include_str!(concat!("../../models/", $file)) }
    };
}

/// Every model preset (see `models/README.md` for the files' sources).
const MODELS: [ModelPreset; 21] = [
    preset!("llama-2-7b", "llama-2-7b.json", ["meta-llama-2-7b"]),
    preset!("llama-2-70b", "llama-2-70b.json", ["meta-llama-2-70b"]),
    preset!("llama-3.1-8b", "llama-3.1-8b.json", ["meta-llama-3.1-8b"]),
    preset!("llama-3.1-70b", "llama-3.1-70b.json", ["meta-llama-3.1-70b"]),
    preset!("llama-3.1-405b", "llama-3.1-405b.json", ["meta-llama-3.1-405b"]),
    preset!("llama-3.3-70b", "llama-3.3-70b.json", []),
    preset!(
        "llama-4-scout-fp8",
        "llama-4-scout-17b-16e-instruct-fp8-dynamic.json",
        ["llama-4-scout-17b-16e-fp8-dynamic"]
    ),
    preset!("qwen2.5-7b", "qwen2.5-7b.json", []),
    preset!("qwen2.5-72b", "qwen2.5-72b-instruct.json", []),
    preset!("qwen3-8b", "qwen3-8b.json", []),
    preset!("qwen3-32b", "qwen3-32b.json", []),
    preset!("qwen3-32b-fp8", "qwen3-32b-fp8.json", []),
    preset!("qwen3-30b-a3b", "qwen3-30b-a3b.json", []),
    preset!("qwen3-235b-a22b", "qwen3-235b-a22b.json", []),
    preset!("mixtral-8x7b", "mixtral-8x7b.json", []),
    preset!("deepseek-v3", "deepseek-v3.json", []),
    preset!("deepseek-v2-lite", "deepseek-v2-lite.json", []),
    preset!("gpt-oss-20b", "gpt-oss-20b.json", []),
    preset!("gpt-oss-120b", "gpt-oss-120b.json", []),
    preset!("granite-3.3-8b", "granite-3.3-8b.json", []),
    preset!("gemma-2-9b", "gemma-2-9b-it.json", []),
];

/// A model name as presets know it: lower case, without the Hugging Face
/// organisation and the variant suffixes of the same architecture
/// (`-instruct`, `-it`, `-v0.1`, …).
fn canonical(name: &str) -> String {
    let mut key = name.trim().to_ascii_lowercase();
    if let Some(last) = key.rsplit('/').next() {
        key = last.to_string();
    }
    while let Some(stripped) =
        ["-instruct", "-it", "-v0.1", "-base", "-hf", "-chat"].iter().find_map(|s| key.strip_suffix(s))
    {
        key = stripped.to_string();
    }
    key
}

impl ModelArch {
    /// The preset called `name` (case-insensitive; Hugging Face ids and
    /// `-instruct`-style variants of the same architecture are accepted).
    pub fn preset(name: &str) -> Option<ModelArch> {
        // Each parsed once per process, when first named (a sweep resolves the
        // model at every grid point; parsing every preset took 1.8 M instructions).
        use std::sync::OnceLock;
        static PARSED: OnceLock<Vec<OnceLock<ModelArch>>> = OnceLock::new();
        let key = canonical(name);
        let i = MODELS.iter().position(|p| p.name == key || p.aliases.contains(&key.as_str()))?;
        let cells = PARSED.get_or_init(|| MODELS.iter().map(|_| OnceLock::new()).collect());
        let p = &MODELS[i];
        let parsed = cells[i].get_or_init(|| {
            config::parse(p.config, p.name)
                .unwrap_or_else(|e| panic!("the shipped preset {} does not parse: {e}", p.name))
        });
        Some(parsed.clone())
    }

    /// Names of all model presets.
    pub fn presets() -> impl Iterator<Item = &'static str> {
        MODELS.iter().map(|p| p.name)
    }

    /// Names of all model presets, for messages.
    pub fn preset_list() -> String {
        Self::presets().collect::<Vec<_>>().join(", ")
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_config(path: &Path) -> Result<ModelArch, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        config::parse(&text, &path.display().to_string()).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// A GPU's datasheet numbers and power model.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    /// Canonical name.
    pub name: String,
    /// Dense BF16 tensor peak, 10¹² FLOP/s.
    pub tflops: f64,
    /// Dense FP8 tensor peak, 10¹² FLOP/s (`None`: no FP8 tensor cores).
    pub fp8_tflops: Option<f64>,
    /// Memory bandwidth, 10¹² bytes/s.
    pub mem_bw_tbps: f64,
    /// Memory capacity, GiB (Opal's `memory_gb` unit; the marketed figure).
    pub memory_gb: f64,
    /// Tensor-parallel interconnect (NVLink, Infinity Fabric or PCIe) per
    /// GPU and direction, 10⁹ bytes/s.
    pub link_gbps: f64,
    /// Board power (its `max_w`: 0 when not known — then no energy figures).
    pub power: PowerModel,
    /// Price of one GPU-hour, US dollars (`None`: not given — no dollar figures).
    pub usd_per_hour: Option<f64>,
}

/// A GPU preset.
struct GpuPreset {
    name: &'static str,
    aliases: &'static [&'static str],
    bf16_tflops: f64,
    fp8_tflops: Option<f64>,
    mem_bw_tbps: f64,
    memory_gb: f64,
    link_gbps: f64,
    /// Board maximum, W.
    power_w: f64,
    /// Measured power (`None`: the shares of [`power::SHARES`]).
    measured: Option<PowerModel>,
}

macro_rules! gpu {
    ($name:literal, [$($alias:literal),*], $bf16:expr, $fp8:expr, $bw:expr, $mem:expr, $link:expr, $w:expr, $measured:expr) => {
        GpuPreset {
            name: $name,
            aliases: &[$($alias),*],
            bf16_tflops: $bf16,
            fp8_tflops: $fp8,
            mem_bw_tbps: $bw,
            memory_gb: $mem,
            link_gbps: $link,
            power_w: $w,
            measured: $measured,
        }
    };
}

/// The H100 SXM's measured power (see [`crate::worker::power`]).
const H100_POWER: PowerModel =
    PowerModel { idle_w: 70.0, active_w: 190.0, compute_w: 900.0, memory_w: 450.0, max_w: 700.0 };
/// The A100 SXM's measured power (see [`crate::worker::power`]).
const A100_POWER: PowerModel =
    PowerModel { idle_w: 60.0, active_w: 100.0, compute_w: 450.0, memory_w: 310.0, max_w: 400.0 };

/// GPU presets: dense (non-sparse) BF16 and FP8 tensor peaks (TFLOP/s),
/// memory bandwidth (TB/s), memory (GiB, as marketed), interconnect per GPU
/// and direction (GB/s) and board power (W) from the vendors' datasheets:
/// NVIDIA's A100 datasheet (dense and sparse listed; NVLink 600 GB/s
/// bidirectional), H100 datasheet and H100 PCIe product brief PB-11133-001
/// (sparse listed: dense is half; NVLink 900 GB/s bidirectional on SXM, PCIe
/// Gen5 ×16 on PCIe), H200 product page (sparse listed), HGX/DGX B200
/// specifications (sparse listed; 7.7 TB/s per GPU in the HGX table; NVLink
/// 1.8 TB/s bidirectional), L40S datasheet (dense listed; PCIe Gen4 ×16);
/// AMD's ROCm documentation for the MI300X (dense listed; 7 Infinity Fabric
/// links of 64 GB/s).
const GPUS: [GpuPreset; 8] = [
    gpu!(
        "A100-40G",
        ["A100-40GB", "A100-SXM-40GB"],
        312.0,
        None,
        1.555,
        40.0,
        300.0,
        400.0,
        Some(PowerModel { idle_w: 45.0, ..A100_POWER })
    ),
    gpu!("A100-80G", ["A100", "A100-80GB", "A100-SXM-80GB"], 312.0, None, 2.039, 80.0, 300.0, 400.0, Some(A100_POWER)),
    gpu!(
        "H100",
        ["H100-SXM", "H100-80G", "H100-SXM5"],
        989.5,
        Some(1979.0),
        3.35,
        80.0,
        450.0,
        700.0,
        Some(H100_POWER)
    ),
    gpu!("H100-PCIE", ["H100-PCIE-80GB"], 756.5, Some(1513.0), 2.0, 80.0, 64.0, 350.0, None),
    gpu!(
        "H200",
        ["H200-SXM", "H200-141G"],
        989.5,
        Some(1979.0),
        4.8,
        141.0,
        450.0,
        700.0,
        Some(PowerModel { idle_w: 80.0, ..H100_POWER })
    ),
    gpu!("B200", ["HGX-B200", "DGX-B200"], 2250.0, Some(4500.0), 7.7, 180.0, 900.0, 1000.0, None),
    gpu!("MI300X", [], 1307.4, Some(2614.9), 5.3, 192.0, 448.0, 750.0, None),
    gpu!("L40S", [], 362.05, Some(733.0), 0.864, 48.0, 32.0, 350.0, None),
];

impl GpuSpec {
    /// Looks up a preset by name (case-insensitive).
    pub fn preset(name: &str) -> Option<GpuSpec> {
        let key = name.trim().to_ascii_uppercase();
        let g = GPUS.iter().find(|g| g.name == key || g.aliases.iter().any(|a| a.eq_ignore_ascii_case(&key)))?;
        Some(GpuSpec {
            name: g.name.to_string(),
            tflops: g.bf16_tflops,
            fp8_tflops: g.fp8_tflops,
            mem_bw_tbps: g.mem_bw_tbps,
            memory_gb: g.memory_gb,
            link_gbps: g.link_gbps,
            power: g.measured.unwrap_or(PowerModel::from_shares(g.power_w, power::SHARES)),
            usd_per_hour: None,
        })
    }

    /// The peaks of one GPU, as the operator model's speed of light.
    pub fn peaks(&self) -> Peaks {
        Peaks {
            bf16_flops: self.tflops * 1e12,
            fp8_flops: self.fp8_tflops.map(|t| t * 1e12),
            mem_bw: self.mem_bw_tbps * 1e12,
            link_bw: self.link_gbps * 1e9,
        }
    }

    /// What `tp` of these GPUs cost over `alive_s` seconds, `busy_s` of
    /// them in steps that took `step_j` joules per GPU: GPU-hours, joules
    /// (NaN when the board power is not known: a GPU that is not a preset
    /// and has no `max_watts`), dollars (NaN without a price).
    pub fn cost(&self, tp: u32, alive_s: f64, busy_s: f64, step_j: f64) -> crate::metrics::CostSummary {
        let gpu_hours = f64::from(tp) * alive_s / 3600.0;
        crate::metrics::CostSummary {
            gpu_hours,
            energy_j: if self.power.max_w > 0.0 { self.power.energy_j(tp, alive_s, busy_s, step_j) } else { f64::NAN },
            usd: self.usd_per_hour.map_or(f64::NAN, |p| p * gpu_hours),
        }
    }

    /// Names of all GPU presets.
    pub fn presets() -> impl Iterator<Item = &'static str> {
        GPUS.iter().map(|g| g.name)
    }

    /// Names of all GPU presets, for messages.
    pub fn preset_list() -> String {
        Self::presets().collect::<Vec<_>>().join(", ")
    }

    /// Other names the preset `name` answers to (`H100-SXM` for `H100`).
    pub fn aliases(name: &str) -> &'static [&'static str] {
        GPUS.iter().find(|g| g.name == name).map_or(&[], |g| g.aliases)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_presets_carry_the_dense_datasheet_figures() {
        let h100 = GpuSpec::preset("h100-sxm").unwrap();
        // The datasheet lists 1,979 BF16 and 3,958 FP8 TFLOP/s with sparsity: half of each, dense.
        assert_eq!(
            (h100.name.as_str(), h100.tflops, h100.fp8_tflops, h100.mem_bw_tbps),
            ("H100", 989.5, Some(1979.0), 3.35)
        );
        assert_eq!(GpuSpec::preset("a100").unwrap().name, "A100-80G");
        assert_eq!(GpuSpec::preset("A100-40G").unwrap().fp8_tflops, None, "Ampere has no FP8 tensor cores");
        assert_eq!(GpuSpec::preset("mi300x").unwrap().memory_gb, 192.0);
        assert!(GpuSpec::preset("TPUv5").is_none());
        assert_eq!(GpuSpec::presets().count(), 8);
    }
}
