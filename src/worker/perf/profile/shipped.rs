//! The measured operator tables shipped in the binary: aiconfigurator's vLLM
//! tables for the GPU presets that have them (`profiles/aiconfigurator/`,
//! whose README names the source, version, license and extraction), read
//! and grouped by shape at build time (`build.rs`); a shape's rows are
//! decoded when a lookup first needs them.

use super::Peaks;
use super::aic::AicTables;
use std::sync::{Arc, OnceLock};

/// One GPU's shipped tables.
struct Shipped {
    /// The GPU preset they belong to.
    gpu: &'static str,
    /// aiconfigurator's name for the system.
    system: &'static str,
    /// The vLLM version they were measured under.
    vllm: &'static str,
    /// The tables, packed (`aic_rows::pack`).
    packed: &'static [u8],
}

macro_rules! shipped {
    ($gpu:literal, $system:literal, $vllm:literal) => {
        Shipped {
            gpu: $gpu,
            system: $system,
            vllm: $vllm,
            packed: include_bytes!(concat!(env!("OUT_DIR"), "/aic-", $system, ".bin")),
        }
    };
}

const SHIPPED: [Shipped; 4] = [
    shipped!("H100", "h100_sxm", "0.24.0"),
    shipped!("H200", "h200_sxm", "0.24.0"),
    shipped!("B200", "b200_sxm", "0.24.0"),
    shipped!("A100-80G", "a100_sxm", "0.14.0"),
];

/// GPU presets with shipped tables.
pub fn gpus() -> impl Iterator<Item = &'static str> {
    SHIPPED.iter().map(|s| s.gpu)
}

/// The shipped tables of GPU preset `gpu` (`None`: it has none); `peaks` are
/// the preset's own (the first call's are kept: they are the preset's).
pub fn tables(gpu: &str, peaks: Peaks) -> Option<Arc<AicTables>> {
    static PARSED: [OnceLock<Arc<AicTables>>; 4] = [const { OnceLock::new() }; 4];
    let i = SHIPPED.iter().position(|s| s.gpu == gpu)?;
    let s = &SHIPPED[i];
    Some(
        PARSED[i]
            .get_or_init(|| {
                let name = format!("aiconfigurator {} vLLM {} tables", s.system, s.vllm);
                Arc::new(
                    AicTables::from_packed(name, peaks, s.packed)
                        .unwrap_or_else(|e| panic!("the shipped tables of {gpu} do not read: {e}")),
                )
            })
            .clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::perf::profile::{Gemm, Precision};
    use crate::worker::presets::GpuSpec;

    #[test]
    fn every_shipped_table_reads_and_holds_its_measurements() {
        for gpu in gpus() {
            let spec = GpuSpec::preset(gpu).unwrap();
            let t = tables(gpu, spec.peaks()).unwrap();
            // A measured H100 GEMM: m = 32768, n = 65536, k = 12288 took 60.324 ms.
            let g = Gemm { m: 32768.0, n: 65536, k: 12288, precision: Precision::Bf16 };
            let secs = t.gemm(&g).unwrap();
            assert!(secs > 0.0 && secs.is_finite(), "{gpu}: {secs}");
            if gpu == "H100" {
                assert!((secs - 60.324_042e-3).abs() < 1e-8, "{secs}");
            }
        }
    }
}
