//! Workload-generation benchmark: the generators alone (no simulation),
//! driven arrival by arrival as the engine drives them, in CPU seconds.
//! The row the issue asks for is RAG with `docs_per_request = num_documents
//! − 1` under a Zipf exponent of 2 — where drawing with replacement and
//! discarding repeats needs ever more draws per document (its last document
//! of a request takes about Σ w / w_min ≈ 1.6 million draws). Run with
//! `cargo bench --bench workload`.

mod common;

use common::{cpu_timed, peak_rss_mib};
use opal::time::SimTime;
use opal::workload::Workload;

fn main() {
    let rag = |docs: u32, per: u32, zipf: f64| {
        format!(
            "type = \"RAGWorkload\"\n[workload.stages.workload_params]\nrequest_rate = 100.0\ntotal_requests = 10000\nnum_documents = {docs}\ndocs_per_request = {per}\ndocument_size = 1\nquery_size = 1\nsystem_prompt_size = 1\ndoc_popularity_zipf = {zipf}\n"
        )
    };
    let rows = [
        ("RAG 999 of 1,000 documents, Zipf 2", rag(1000, 999, 2.0)),
        ("RAG 4 of 1,000 documents, Zipf 1", rag(1000, 4, 1.0)),
        ("RAG 4 of 1,000,000 documents, Zipf 1", rag(1_000_000, 4, 1.0)),
        ("RAG 4 of 1,000 documents, uniform", rag(1000, 4, 0.0)),
        ("RAG 999 of 1,000 documents, uniform", rag(1000, 999, 0.0)),
        (
            "ExponentialReqRate, lognormal lengths",
            "type = \"ExponentialReqRate\"\n[workload.stages.workload_params]\nrequest_rate = 100.0\ntotal_requests = 10000\nprompt_size = { dist = \"lognormal\", mean = 2000, std = 1000, max = 8000 }\n".to_string(),
        ),
    ];
    println!("{:<40}{:>12}{:>16}", "generator (10,000 requests)", "CPU s", "µs / request");
    for (label, stage) in rows {
        let text = format!("[model.model_params]\nname = \"llama-3.1-8b\"\n[[workload.stages]]\n{stage}");
        let file = opal::config::parse_spec(&text, "bench.toml").expect("spec");
        let scenario = opal::config::resolve(&file, "bench.toml", std::path::Path::new(".")).expect("scenario");
        let seeds = opal::rng::SeedTree::new(1);
        let (sent, secs) = cpu_timed(|| {
            let mut w = Workload::new(scenario.stages.clone(), &seeds);
            let (mut out, mut sent) = (Vec::new(), 0);
            let mut next = w.start(SimTime::ZERO).expect("start");
            while let Some((stage, t)) = next {
                next = w.on_arrival(t, stage, &mut out).expect("arrival");
                sent += out.len();
                out.clear();
            }
            sent
        });
        assert_eq!(sent, 10_000, "{label}");
        println!("{label:<40}{secs:>12.3}{:>16.2}", secs * 1e6 / sent as f64);
    }
    if let Some(rss) = peak_rss_mib() {
        println!("peak RSS of the whole benchmark: {rss:.0} MiB");
    }
}
