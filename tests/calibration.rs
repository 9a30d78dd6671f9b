//! Calibration seen from outside: fitting the roofline to the Python Opal's
//! SC25 measurements and running the SC25 benchmark with the fit.

use crate::{run, scenario};
use opal::worker::calibrate::calibrate;
use opal::worker::model::ModelArch;
use opal::worker::perf::LatencyRows;
use opal::worker::presets::GpuSpec;

const SC25: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/calibration/sc25-llama-3.1-70b-h100-tp4.csv");

/// Opal's SC25 benchmark (its ten prompt sizes, cold then warm) on
/// Llama-3.1-70B over 4 H100s, with `inference` as the step model's block.
fn sc25_run(inference: &str) -> opal::RunOutput {
    run(&scenario(&format!(
        r#"
        [model.model_params]
        name = "llama-3.1-70b"
        [worker.hw]
        gpu = "H100"
        tp = 4
        [kvc]
        kvc_tiers = []
        [[workload.stages]]
        type = "SC25Workload"
        {inference}
        "#
    )))
}

#[test]
fn a_fit_to_the_sc25_measurements_reproduces_them_in_an_sc25_run() {
    let rows = LatencyRows::from_csv(std::path::Path::new(SC25)).unwrap();
    assert_eq!(rows.prefill.len(), 10);
    let (model, gpu) = (ModelArch::preset("llama-3.1-70b").unwrap(), GpuSpec::preset("H100").unwrap());
    let fit = calibrate(&model, &gpu, 4, &rows).unwrap();
    assert!(fit.worst().unwrap().residual().abs() < 0.033, "{:?}", fit.worst());
    let ratios = |out: &opal::RunOutput| -> Vec<f64> {
        assert_eq!(out.sc25.len(), rows.prefill.len());
        out.sc25
            .iter()
            .zip(&rows.prefill)
            .map(|(r, &(tokens, secs))| {
                assert_eq!(f64::from(r.prompt_tokens), tokens);
                r.cold_ttft_ms.unwrap() / (secs * 1e3)
            })
            .collect()
    };
    // With the fitted block every cold prefill lands within 5 % of its measurement.
    let fitted = ratios(&sc25_run(&fit.toml()));
    assert!(fitted.iter().all(|r| (r - 1.0).abs() < 0.05), "simulated / measured: {fitted:?}");
    // Opal's default a = 4, b = 24 is optimistic: 0.46× at 4k tokens, 0.83× at 131k.
    let opal = ratios(&sc25_run(""));
    assert!((opal[0] - 0.46).abs() < 0.01 && (opal[9] - 0.83).abs() < 0.01, "{opal:?}");
}
