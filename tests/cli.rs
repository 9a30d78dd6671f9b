//! The binary as a user runs it.

use crate::sweep::opal_sweep;
use crate::temp_dir;
use std::path::Path;
use std::process::{Command, Output};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes `text` as `spec.toml` in a fresh directory and runs it.
fn run_spec(name: &str, text: &str) -> Output {
    run_spec_in(name, text).1
}

/// [`run_spec`], also giving the directory it ran in.
fn run_spec_in(name: &str, text: &str) -> (std::path::PathBuf, Output) {
    let dir = temp_dir(name);
    std::fs::write(dir.join("spec.toml"), text).unwrap();
    let o = opal_sweep(&["spec.toml", "-o", "out"], &dir);
    (dir, o)
}

fn assert_input_error(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(2), "exit code; stderr: {}", stderr(o));
    let err = stderr(o);
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
}

#[test]
fn a_missing_spec_file_is_an_input_error() {
    let o = opal_sweep(&["no/such/spec.toml"], &temp_dir("missing"));
    assert_input_error(&o, &["no/such/spec.toml", "cannot read the spec file"]);
}

#[test]
fn a_spec_that_is_not_a_regular_file_or_is_huge_is_refused_without_reading_it_all() {
    let dir = temp_dir("not-a-file");
    // A device that never ends, a FIFO that would block, a directory.
    let fifo = dir.join("spec.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for path in ["/dev/zero", fifo.to_str().unwrap(), dir.to_str().unwrap()] {
        let o = opal_sweep(&[path, "--dry-run"], &dir);
        assert_input_error(&o, &[path, "not a regular file"]);
    }
    // More than 16 MiB.
    let big = dir.join("big.toml");
    std::fs::write(&big, vec![b'#'; (16 << 20) + 1]).unwrap();
    let o = opal_sweep(&["big.toml", "--dry-run"], &dir);
    assert_input_error(&o, &["big.toml", "larger than 16 MiB"]);
    // A trace that is a device.
    let trace = "[model.model_params]\nname = \"llama-3.1-8b\"\n[[workload.stages]]\ntype = \"Trace\"\n[workload.stages.workload_params]\ntrace_file = \"/dev/zero\"\n";
    let o = run_spec("trace-device", trace);
    assert_input_error(&o, &["/dev/zero", "not a regular file", "trace_file"]);
}

#[test]
fn invalid_toml_names_the_line() {
    let o = run_spec("badtoml", "[simulation]\nseed = 1\nnum_workers = = 2\n");
    assert_input_error(&o, &["spec.toml:3:", "invalid TOML"]);
}

#[test]
fn an_unknown_key_names_the_path_and_the_closest_valid_key() {
    let o = run_spec("unknown", "[router.router_params]\npolicyy = \"RoundRobin\"\n");
    assert_input_error(&o, &["spec.toml:2:", "`router.router_params.policyy`", "did you mean `policy`?"]);
}

#[test]
fn a_negative_rate_is_rejected() {
    let o = run_spec(
        "negrate",
        "[[workload.stages]]\ntype = \"ExponentialReqRate\"\n[workload.stages.workload_params]\nrequest_rate = -1.0\n",
    );
    assert_input_error(&o, &["`workload.stages.0.workload_params.request_rate`", "must be a positive number"]);
}

#[test]
fn prompt_min_above_max_is_rejected() {
    let o = run_spec(
        "minmax",
        "[[workload.stages]]\ntype = \"UniformReqRate\"\n[workload.stages.workload_params]\nprompt_size_min = 500\nprompt_size_max = 100\n",
    );
    assert_input_error(&o, &["prompt_size_min (500) is greater than prompt_size_max (100)", "fix:"]);
}

#[test]
fn a_model_that_does_not_fit_is_rejected() {
    let o = run_spec("nofit", "[model.model_params]\nname = \"llama-3.1-70b\"\n[worker.hw]\ngpu = \"A100-80G\"\n");
    assert_input_error(&o, &["does not fit in GPU memory", "worker.hw.tp"]);
}

#[test]
fn a_valid_spec_prints_a_summary_and_writes_results() {
    let o = run_spec(
        "valid",
        "[sweep]\nname = \"tiny\"\n[[workload.stages]]\ntype = \"UniformReqRate\"\n[workload.stages.workload_params]\ntotal_requests = 5\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("5 generated, 5 completed"), "{stdout}");
    assert!(stdout.contains("TTFT"));
    assert!(stdout.contains("1 run ok, 0 failed"), "one run, singular: {stdout}");
    let out = std::env::temp_dir().join(format!("opal-test-valid-{}", std::process::id())).join("out");
    let runs = crate::sweep::read(&out.join("runs.parquet"));
    assert_eq!(runs.num_rows(), 1);
    assert_eq!(opal::output::f64_column(&runs, "requests_completed").unwrap(), vec![Some(5.0)]);
    assert!(out.join("manifest.json").exists());
}

#[test]
fn help_explains_the_command() {
    let o = opal_sweep(&["--help"], &temp_dir("help"));
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Usage: opal-sweep") && out.contains("--output") && out.contains("Exit codes"), "{out}");
    // Every table is named, and every file an example names exists in the repository.
    for table in opal::output::TableKind::WRITE_ORDER {
        assert!(out.contains(&table.file_name()), "--help does not name {}", table.file_name());
    }
    assert!(out.contains("search.parquet"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for word in out.split_whitespace().filter(|w| (w.ends_with(".toml") || w.ends_with(".json")) && w.contains('/')) {
        assert!(root.join(word).is_file(), "--help names {word}, which does not exist");
    }
}

#[test]
fn every_shipped_sweep_expands() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut seen = 0;
    for entry in std::fs::read_dir(root.join("sweeps")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let o = opal_sweep(&[path.to_str().unwrap(), "--dry-run"], root);
            assert!(o.status.success(), "{}: {}", path.display(), stderr(&o));
            seen += 1;
        }
    }
    assert!(seen >= 5, "only {seen} sweeps found");
}

/// The Opal `defaults.json`-shaped fixture, with keys Opal has and we do not.
const OPAL_JSON: &str = "tests/fixtures/opal/defaults.json";

#[test]
fn an_opal_json_config_runs_unchanged_and_reports_what_it_ignores() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = temp_dir("opal-json");
    let o = opal_sweep(&[OPAL_JSON, "-o", out.to_str().unwrap(), "-q"], root);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for key in [
        "simulation.save_simulation_data",
        "simulation.show_progress",
        "simulation.max_wall_time_sec",
        "worker.worker_params.worker_local_queue_capacity",
        "worker.hw.num_gpus",
        "worker.vllm_params.lookahead_reqs",
    ] {
        assert!(err.contains(&format!("ignored `{key}`")), "{key} not reported:\n{err}");
    }
    assert!(err.contains("enable_gpu_apc → worker.vllm_params.enable_prefix_caching"), "{err}");
    assert!(out.join("runs.parquet").is_file());
}

#[test]
fn convert_writes_toml_that_runs_to_identical_results() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = temp_dir("convert");
    let toml_path = dir.join("converted.toml");
    let o = opal_sweep(&["convert", OPAL_JSON, "-o", toml_path.to_str().unwrap()], root);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&toml_path).unwrap();
    assert!(text.contains("# ignored (no counterpart here): simulation.show_progress"), "{text}");
    assert!(text.contains("prompt_content = \"single_sequence\""), "{text}");
    assert!(text.contains("enable_prefix_caching = true"), "{text}");
    // A second convert refuses to overwrite without --force.
    let again = opal_sweep(&["convert", OPAL_JSON, "-o", toml_path.to_str().unwrap()], root);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("--force"));

    let simulate = |path: &Path| {
        let spec = opal::config::load_spec(path).unwrap_or_else(|e| panic!("{e}"));
        let plan = opal::sweep::plan(&spec).unwrap_or_else(|e| panic!("{e}"));
        let run = plan.runs().next().unwrap();
        opal::simulate(&opal::sweep::run_scenario(&run).unwrap()).unwrap()
    };
    let from_json = simulate(&root.join(OPAL_JSON));
    let from_toml = simulate(&toml_path);
    assert_eq!(from_json.summary.requests_completed, 70, "40 synthetic + 30 trace requests");
    // Debug text, so that equal NaNs (metrics with no samples) compare equal.
    assert_eq!(format!("{:?}", from_json.summary), format!("{:?}", from_toml.summary));
    assert_eq!(from_json.event_digest, from_toml.event_digest, "the same events in the same order");
}

#[test]
fn a_broken_opal_json_names_the_line() {
    let dir = temp_dir("opal-json-bad");
    std::fs::write(dir.join("c.json"), "{\n  \"simulation\": {\n    \"seed\": 1,\n  }\n}\n").unwrap();
    let o = opal_sweep(&["c.json"], &dir);
    assert_input_error(&o, &["c.json", "line 4", "invalid JSON"]);
    std::fs::write(dir.join("d.json"), "{\"simulation\": {\"num_workers\": \"two\"}}").unwrap();
    let o = opal_sweep(&["d.json"], &dir);
    assert_input_error(&o, &["d.json", "simulation.num_workers"]);
}

#[test]
fn the_shipped_trace_replays_from_sweeps_and_prints_cache_hit_ratios() {
    // The scenario of sweeps/dfs-bandwidth.toml (the shipped Mooncake trace
    // on CPU + DFS tiers), cut to 300 requests.
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps/dfs-bandwidth.toml");
    let spec = format!(
        "[sweep]\nname = \"trace\"\nbase = {:?}\n[grid]\n\"workload.stages.0.workload_params.total_requests\" = [300]\n",
        base.display().to_string()
    );
    let (dir, o) = run_spec_in("trace-hits", &spec);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().find(|l| l.starts_with("KV cache: prefix hit ")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("GPU ") && line.contains("DistributedFS "), "{line}");
    // The printed ratio is the runs table's.
    let runs = crate::sweep::read(&dir.join("out/runs.parquet"));
    let ratio = opal::output::f64_column(&runs, "prefix_hit_ratio").unwrap()[0].unwrap();
    assert!(ratio > 0.0);
    assert!(line.starts_with(&format!("KV cache: prefix hit {:.1} % ", 100.0 * ratio)), "{line} vs {ratio}");
}

/// `opal-sweep` with `HF_HOME` set to `hf_home` (so that no Hugging Face
/// cache of the machine's can interfere).
fn opal_sweep_hf(args: &[&str], cwd: &Path, hf_home: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opal-sweep"))
        .args(args)
        .current_dir(cwd)
        .env("HF_HOME", hf_home)
        .env_remove("HF_HUB_CACHE")
        .output()
        .expect("binary runs")
}

#[test]
fn an_opal_json_with_a_misspelt_key_exits_2_with_a_did_you_mean() {
    let dir = temp_dir("opal-json-typo");
    let json = "{\"workload\": {\"stages\": [{\"type\": \"ExponentialReqRate\",\n  \"workload_params\": {\"request_rte\": 12.0, \"total_requests\": 5}}]}}";
    std::fs::write(dir.join("c.json"), json).unwrap();
    let o = opal_sweep(&["c.json"], &dir);
    assert_input_error(&o, &["c.json:2:", "request_rte", "did you mean `request_rate`"]);
    assert!(!dir.join("results").exists(), "nothing ran");
}

#[test]
fn an_opal_json_hf_url_runs_the_model_it_names_or_fails_clearly() {
    let dir = temp_dir("opal-json-hf");
    let hf_home = dir.join("hf");
    let json = |url: &str| {
        format!(
            r#"{{"model": {{"model_params": {{"hf_url": "{url}"}}}},
                "worker": {{"hw": {{"tp": 4}}}},
                "workload": {{"stages": [{{"type": "UniformReqRate", "workload_params": {{"total_requests": 3}}}}]}}}}"#
        )
    };
    // A preset, named by its Hugging Face id or URL, runs as that model.
    std::fs::write(dir.join("70b.json"), json("https://huggingface.co/meta-llama/Llama-3.1-70B")).unwrap();
    let spec = opal::config::load_spec(&dir.join("70b.json")).unwrap_or_else(|e| panic!("{e}"));
    let plan = opal::sweep::plan(&spec).unwrap();
    let scenario = opal::sweep::run_scenario(&plan.runs().next().unwrap()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((scenario.model.name.as_str(), scenario.model.num_layers), ("llama-3.1-70b", 80));
    let o = opal_sweep_hf(&["70b.json", "-q", "-o", "out70"], &dir, &hf_home);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("hf_url = \"https://huggingface.co/meta-llama/Llama-3.1-70B\" → the preset"));

    // Neither a preset nor in the Hugging Face cache: exit 2, saying how to provide it.
    std::fs::write(dir.join("other.json"), json("acme/tiny-llama")).unwrap();
    let o = opal_sweep_hf(&["other.json"], &dir, &hf_home);
    assert_input_error(&o, &["other.json:1:", "model.model_params.hf_url", "acme/tiny-llama", "config_path"]);

    // In the cache (where Opal's transformers would have put it): that config.json.
    let snapshot = hf_home.join("hub/models--acme--tiny-llama/snapshots/0123abc");
    std::fs::create_dir_all(&snapshot).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/opal/models/llama-3.1-8b/config.json");
    std::fs::copy(fixture, snapshot.join("config.json")).unwrap();
    let o = opal_sweep_hf(&["convert", "other.json", "-o", "-"], &dir, &hf_home);
    assert!(o.status.success(), "{}", stderr(&o));
    let toml = String::from_utf8_lossy(&o.stdout);
    assert!(toml.contains("config_path") && toml.contains("0123abc"), "{toml}");
}

#[test]
fn model_prints_what_is_derived_from_deepseek_v3_on_eight_h200s() {
    let o = opal_sweep(&["model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--json"], &temp_dir("model-json"));
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let n = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {v}"));
    assert!((n("params") / 671e9 - 1.0).abs() < 0.005, "{}", n("params"));
    assert!((n("active_params") / 37.5e9 - 1.0).abs() < 0.01, "{}", n("active_params"));
    assert_eq!(n("kv_bytes_per_token"), 70_272.0);
    assert!(n("weight_bytes") > 6.5e11 && n("weight_bytes") < 7.0e11, "FP8 weights: {}", n("weight_bytes"));
    let fit = &v["fit"];
    // 8 × 141 GiB × 0.9 less the weights, in blocks of 16 tokens of 70,272 B
    // on each of the 8 GPUs (every GPU keeps the MLA latent whole).
    let expect = ((8.0 * 141.0 * 1073741824.0 * 0.9 - n("weight_bytes")) / (16.0 * 8.0 * 70_272.0)).floor();
    assert_eq!(expect, 46_350.0);
    assert_eq!(fit["fits"], true);
    assert_eq!(fit["kv_pool_blocks"].as_f64().unwrap(), expect);
    assert_eq!(fit["max_batch_at_context"].as_f64().unwrap(), (expect / 512.0).floor(), "8,192 tokens = 512 blocks");
}

#[test]
fn model_prints_each_pipeline_stages_layers_and_weights() {
    // Llama-3.1-405B at TP 8 × PP 2 (sized by hand in tests/pipeline.rs).
    let dir = temp_dir("model-pp");
    let o = opal_sweep(&["model", "llama-3.1-405b", "--gpu", "H100", "--tp", "8", "--pp", "2"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("on 2 stages of 8 × H100"), "{text}");
    assert!(text.contains("layers 63 + 63; weights per GPU 47.25 + 47.25 GiB"), "{text}");
    assert!(text.contains("51497 blocks of 16 = 823952 tokens"), "{text}");
    let o = opal_sweep(&["model", "llama-3.1-8b", "--pp", "33"], &dir);
    assert_input_error(&o, &["--pp 33", "32 layers"]);
}

#[test]
fn model_says_when_a_model_does_not_fit_and_refuses_unmodelled_families() {
    let dir = temp_dir("model-fit");
    let o = opal_sweep(&["model", "llama-3.1-405b", "--gpu", "H100", "--tp", "4"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("does not fit: the weights need 756.0 GiB, 288.0 GiB is available"), "{text}");
    std::fs::write(dir.join("config.json"), r#"{"model_type": "jamba", "hidden_size": 4096}"#).unwrap();
    let o = opal_sweep(&["model", "config.json"], &dir);
    assert_input_error(&o, &["config.json", "`jamba`", "state-space", "supported"]);
    // The same file as a scenario's model: exit 2, naming the key.
    let o = run_spec("model-family", "[model.model_params]\nconfig_path = \"/nonexistent/x.json\"\n");
    assert_input_error(&o, &["model.model_params.config_path"]);
    let spec = format!("[model.model_params]\nconfig_path = {:?}\n", dir.join("config.json").display().to_string());
    assert_input_error(&run_spec("model-family-2", &spec), &["model.model_params.config_path", "`jamba`"]);
}

#[test]
fn calibrate_writes_an_inference_block_that_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let csv = root.join("examples/calibration/sc25-llama-3.1-70b-h100-tp4.csv");
    let args = ["calibrate", csv.to_str().unwrap(), "--model", "llama-3.1-70b", "--gpu", "H100", "--tp", "4"];
    let o = opal_sweep(&args, root);
    assert!(o.status.success(), "{}", stderr(&o));
    // The SC25 prefills: the default model 12 % fast in the median,
    // each row predicted by a fit without it within 2.4 % in the median.
    assert!(stderr(&o).contains("default model:       median 12.2 %, max 15.4 %"), "{}", stderr(&o));
    assert!(stderr(&o).contains("held out (each row predicted by a fit without it): median 2.4 %"), "{}", stderr(&o));
    let block = String::from_utf8_lossy(&o.stdout);
    let t: toml::Table = block.parse().unwrap();
    let p = &t["worker"]["inference_params"];
    assert_eq!(p["model"].as_str(), Some("operators"), "{block}");
    assert!((p["compute_scale"].as_float().unwrap() - 1.15).abs() < 0.05, "{block}");
    // The block runs as a scenario's.
    let spec = format!("[model.model_params]\nname = \"llama-3.1-70b\"\n[worker.hw]\ntp = 4\n{block}");
    let o = run_spec("calibrated", &spec);
    assert!(o.status.success(), "{}", stderr(&o));
    // A row that is not a finite number is refused, naming its line and column.
    let dir = temp_dir("calibrate-inf");
    std::fs::write(dir.join("m.csv"), "phase,batch_size,tokens,latency_ms\nprefill,,100,inf\n").unwrap();
    let o = opal_sweep(&["calibrate", "m.csv", "--model", "llama-3.1-8b", "--gpu", "H100"], &dir);
    assert_input_error(&o, &["m.csv:2", "latency_ms", "finite"]);
    // A measurements file with a bad row names its line.
    let dir = temp_dir("calibrate-bad");
    std::fs::write(dir.join("m.csv"), "phase,batch_size,tokens,latency_ms\nprefill,,100,5\nprefil,,200,9\n").unwrap();
    let o = opal_sweep(&["calibrate", "m.csv", "--model", "llama-3.1-8b", "--gpu", "H100"], &dir);
    assert_input_error(&o, &["m.csv:3", "prefil"]);
}

#[test]
fn config_prints_the_defaults_and_presets_lists_models_and_gpus() {
    let dir = temp_dir("config-cli");
    let o = opal_sweep(&["config", "--defaults"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    // It parses as a spec, and says every default.
    std::fs::write(dir.join("d.toml"), text.as_bytes()).unwrap();
    assert!(opal_sweep(&["d.toml", "--dry-run"], &dir).status.success());
    for key in ["policy = \"MaxPrefix\"", "block_size = 16", "gpu_memory_utilization = 0.9", "capacity_GB = 8.0"] {
        assert!(text.contains(key), "{key} missing");
    }
    let o = opal_sweep(&["presets"], &dir);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("deepseek-v3") && text.contains("H200") && text.contains("4.80"), "{text}");
    std::fs::write(dir.join("one.toml"), "[model.model_params]\nname = \"llama-3.1-8b\"\n").unwrap();
    // A spec's effective configuration writes the GPU's board-power model out.
    let o = opal_sweep(&["config", "one.toml"], &dir);
    let text = String::from_utf8_lossy(&o.stdout);
    for key in ["max_watts = ", "idle_watts = ", "active_watts = ", "compute_watts = ", "memory_watts = "] {
        assert!(o.status.success() && text.contains(key), "{key} missing:\n{text}");
    }
    let o = opal_sweep(&["config", "one.toml", "--point", "3"], &dir);
    assert_input_error(&o, &["one.toml", "1 grid points; there is no point 3", "fix:"]);
}

#[test]
fn model_and_calibrate_refuse_bad_options_with_a_fix() {
    let dir = temp_dir("model-calibrate-options");
    // vLLM refuses a tensor-parallel degree that does not divide the heads.
    let o = opal_sweep(&["model", "llama-3.1-8b", "--tp", "3"], &dir);
    assert_input_error(&o, &["--tp 3", "32 attention heads", "1, 2, 4, 8, 16, 32", "fix:"]);
    for args in [["--tp", "0"], ["--block-size", "0"], ["--gpu-memory-utilization", "1.5"]] {
        let o = opal_sweep(&["model", "llama-3.1-8b", args[0], args[1]], &dir);
        assert_input_error(&o, &[args[0], "fix:"]);
    }
    std::fs::write(dir.join("ok.csv"), "phase,batch_size,tokens,latency_ms\nprefill,1,512,30\n").unwrap();
    std::fs::write(dir.join("empty.csv"), "phase,batch_size,tokens,latency_ms\n").unwrap();
    std::fs::write(dir.join("inf.csv"), "phase,batch_size,tokens,latency_ms\nprefill,1,512,inf\n").unwrap();
    let base = ["calibrate", "--model", "llama-3.1-8b", "--gpu", "H100"];
    for (extra, needle) in [
        (&["--tp", "0", "ok.csv"][..], "--tp"),
        (&["--profile", "no/such/dir", "ok.csv"][..], "--profile"),
        (&["--fit", "banana", "ok.csv"][..], "banana"),
        (&["empty.csv"][..], "no measurements"),
        (&["inf.csv"][..], "inf.csv:2"),
        (&["no-such.csv"][..], "no-such.csv"),
        // The file to predict is read before the fit.
        (&["--predict", "no-such.csv", "ok.csv"][..], "no-such.csv"),
    ] {
        let o = opal_sweep(&[&base[..], extra].concat(), &dir);
        assert_input_error(&o, &[needle, "fix:"]);
        assert!(!stderr(&o).contains("residual"), "the fit ran before the error:\n{}", stderr(&o));
    }
}

#[test]
fn config_writes_a_spec_whose_base_only_fits_once_an_axis_sets_tp() {
    let dir = temp_dir("config-zip-tp");
    let spec = "[model.model_params]\nname = \"llama-3.1-70b\"\n[[zip]]\n\"worker.hw.tp\" = [4, 8]\n\"simulation.seed\" = [1, 2]\n";
    std::fs::write(dir.join("spec.toml"), spec).unwrap();
    let o = opal_sweep(&["config", "spec.toml"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("does not resolve") && text.contains("grid point 0's"), "{text}");
    assert!(text.contains("tp = 4"), "{text}");
}

#[test]
fn opal_json_values_json_refuses_name_their_key_and_a_repeated_key_is_refused() {
    let dir = temp_dir("opal-json-values");
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/opal/exponential-12rps.json"))
            .unwrap();
    assert!(example.contains("\"request_rate\": 12.0"));
    let key = "`workload.stages.0.workload_params.request_rate`";
    for (name, with, fix) in [
        ("nan", "\"request_rate\": NaN", "JSON has no NaN or Infinity"),
        ("big", "\"request_rate\": 1e400", "a 64-bit float holds"),
        ("twice", "\"request_rate\": 12.0, \"request_rate\": 99.0", "set it once"),
    ] {
        std::fs::write(dir.join(format!("{name}.json")), example.replacen("\"request_rate\": 12.0", with, 1)).unwrap();
        let o = opal_sweep(&[&format!("{name}.json"), "--dry-run"], &dir);
        assert_input_error(&o, &[&format!("{name}.json:30:"), key, fix]);
    }
}

#[test]
fn model_refuses_a_zero_context_and_says_how_to_fix_a_bad_config() {
    let dir = temp_dir("model-inputs");
    let o = opal_sweep(&["model", "llama-3.1-8b", "--gpu", "H100", "--context", "0"], &dir);
    assert_input_error(&o, &["--context must be at least 1", "fix:"]);
    std::fs::write(dir.join("config.json"), "{\"hidden_size\": 4096}").unwrap();
    let o = opal_sweep(&["model", "config.json"], &dir);
    assert_input_error(&o, &["config.json", "fix:"]);
}

#[test]
fn a_specs_output_directory_is_relative_to_the_spec_as_its_other_paths_are() {
    let dir = temp_dir("output-relative");
    std::fs::create_dir_all(dir.join("studies")).unwrap();
    let spec = "[sweep]\nname = \"rel\"\noutput = \"out\"\n[model.model_params]\nname = \"llama-3.1-8b\"\n[[workload.stages]]\ntype = \"ExponentialReqRate\"\n[workload.stages.workload_params]\nrequest_rate = 5.0\ntotal_requests = 5\n";
    std::fs::write(dir.join("studies/spec.toml"), spec).unwrap();
    let o = opal_sweep(&["studies/spec.toml", "-q"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.join("studies/out/runs.parquet").exists(), "next to the spec");
    assert!(!dir.join("out").exists(), "not in the directory it was run from");
}

#[test]
fn config_on_a_bad_spec_names_its_line_key_and_fix_as_a_run_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad_inputs");
    let o = opal_sweep(&["config", "block-size-against-chunk.toml"], &dir);
    assert_input_error(&o, &["block-size-against-chunk.toml:7:", "`worker.vllm_params.block_size`", "fix:"]);
}

#[test]
fn calibrate_refuses_rows_it_cannot_simulate_in_time_an_empty_fit_and_says_when_constants_are_not_identifiable() {
    let dir = temp_dir("calibrate-bounds");
    let args = |csv: &'static str| ["calibrate", "--model", "llama-3.1-8b", "--gpu", "H100", csv];
    std::fs::write(dir.join("huge.csv"), "phase,batch_size,tokens,latency_ms\nprefill,1,1000000000,50\n").unwrap();
    let o = opal_sweep(&args("huge.csv"), &dir);
    assert_input_error(&o, &["huge.csv: line 2: tokens 1000000000 is more than the 1048576", "fix:"]);
    std::fs::write(
        dir.join("long.csv"),
        "phase,batch_size,tokens,latency_ms,output_tokens\ndecode,1,512,9,1000000000\n",
    )
    .unwrap();
    assert_input_error(&opal_sweep(&args("long.csv"), &dir), &["line 2: output_tokens", "fix:"]);
    // Eight identical prefill rows: a fit, said not to pin the constants.
    let same = "phase,batch_size,tokens,latency_ms\n".to_string() + &"prefill,1,1024,50\n".repeat(8);
    std::fs::write(dir.join("same.csv"), same).unwrap();
    let mut empty = args("same.csv").to_vec();
    empty.extend(["--fit", ""]);
    assert_input_error(&opal_sweep(&empty, &dir), &["--fit names no constant", "fix:"]);
    let o = opal_sweep(&args("same.csv"), &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("the rows tell only 1 of the 5 constants fitted apart"), "{}", stderr(&o));
}
