//! Common random numbers: the request stream a spec and seed generate is the
//! same whatever the router, the worker count (and so the timing) — compared
//! on the requests table, request by request.

use crate::fixtures::Spec;
use opal::metrics::RequestRecord;
use opal::workload::Label;
use std::collections::BTreeMap;
use toml::toml;

/// Three platforms that time requests differently: one worker (queues), four
/// with round-robin, six with the KV-aware router.
const PLATFORMS: [(&str, u32); 3] = [("RoundRobin", 1), ("RoundRobin", 4), ("MaxPrefix", 6)];

/// The requests of one stage of type `kind` with `params` on each platform.
fn runs(kind: &str, params: toml::Table) -> Vec<Vec<RequestRecord>> {
    PLATFORMS
        .iter()
        .map(|&(policy, workers)| {
            Spec::llama8b()
                .set("simulation.seed", 11)
                .set("simulation.num_workers", workers)
                .set("router.router_params.policy", policy)
                .stage(kind, params.clone())
                .run()
                .requests
        })
        .collect()
}

/// What an open-loop stage generates, request by request: arrival, prompt
/// content, lengths.
fn open_loop(r: &RequestRecord) -> (u32, u64, u64, u32, u32) {
    (r.stage, (r.arrival_s * 1e9).round() as u64, r.prompt_hash, r.prompt_tokens, r.output_tokens)
}

fn same_open_loop_stream(kind: &str, params: toml::Table) {
    let all = runs(kind, params);
    assert!(all[0].len() >= 50, "{} requests", all[0].len());
    let first: Vec<_> = all[0].iter().map(open_loop).collect();
    for (other, (policy, workers)) in all[1..].iter().zip(&PLATFORMS[1..]) {
        let this: Vec<_> = other.iter().map(open_loop).collect();
        assert_eq!(this, first, "{policy} on {workers} workers generated another stream");
    }
    // The platforms did time the requests differently.
    let ttft = |rs: &[RequestRecord]| rs.iter().filter_map(|r| r.ttft_s).sum::<f64>();
    assert_ne!(ttft(&all[0]), ttft(&all[2]));
}

#[test]
fn rate_stages_generate_the_same_stream_on_any_platform() {
    same_open_loop_stream(
        "ExponentialReqRate",
        toml! {
            request_rate = 30.0
            total_requests = 120
            prompt_size = { dist = "lognormal", mean = 1500, std = 800, max = 6000 }
            output_tokens = { dist = "uniform", min = 10, max = 200 }
        },
    );
}

#[test]
fn trace_stages_generate_the_same_stream_on_any_platform() {
    same_open_loop_stream(
        "Trace",
        toml! { trace_file = "traces/conversation_trace.jsonl" total_requests = 150 time_scale = 0.05 },
    );
}

#[test]
fn rag_stages_generate_the_same_stream_on_any_platform() {
    same_open_loop_stream(
        "RAGWorkload",
        toml! {
            request_rate = 20.0
            total_requests = 120
            num_documents = 50
            docs_per_request = 5
            document_size = 300
            doc_popularity_zipf = 1.1
            output_tokens = { dist = "uniform", min = 10, max = 100 }
            max_outstanding_requests = 1000
        },
    );
}

#[test]
fn sc25_stages_send_the_same_prompts_in_the_same_order_on_any_platform() {
    let all = runs("SC25Workload", toml! { prompt_sizes = [1000, 5000, 20000] });
    let seq = |rs: &[RequestRecord]| -> Vec<_> {
        rs.iter().map(|r| (r.prompt_hash, r.prompt_tokens, r.output_tokens, r.label)).collect()
    };
    assert_eq!(all[0].len(), 6);
    for other in &all[1..] {
        assert_eq!(seq(other), seq(&all[0]));
    }
}

/// Session → its turns: (prompt hash, prompt tokens, output tokens, think
/// time before the turn in µs — the gap from the previous turn's response).
type Conversations = BTreeMap<u32, Vec<(u64, u32, u32, Option<i64>)>>;

fn conversations(rs: &[RequestRecord]) -> Conversations {
    let mut by_turn: BTreeMap<(u32, u32), &RequestRecord> = BTreeMap::new();
    for r in rs {
        let Label::Session { session, turn } = r.label else { panic!("a Sessions request without its label") };
        by_turn.insert((session, turn), r);
    }
    let mut out = Conversations::new();
    for (&(session, turn), r) in &by_turn {
        let think = (turn > 1).then(|| {
            let prev = by_turn[&(session, turn - 1)];
            ((r.arrival_s - (prev.arrival_s + prev.e2e_s.expect("answered"))) * 1e6).round() as i64
        });
        out.entry(session).or_default().push((r.prompt_hash, r.prompt_tokens, r.output_tokens, think));
    }
    out
}

#[test]
fn sessions_are_the_same_conversations_on_any_platform() {
    let all = runs(
        "Sessions",
        toml! {
            session_rate = 4.0
            total_sessions = 25
            turns = { dist = "uniform", min = 1, max = 6 }
            input_tokens = { dist = "uniform", min = 50, max = 800 }
            output_tokens = { dist = "lognormal", mean = 150, std = 100, max = 600 }
            think_time_sec = { dist = "exponential", mean = 1.5 }
        },
    );
    let first = conversations(&all[0]);
    assert_eq!(first.len(), 25);
    let turns: Vec<usize> = first.values().map(Vec::len).collect();
    assert!(turns.iter().any(|&t| t > 3) && turns.iter().any(|&t| t < 3), "{turns:?}");
    for (other, (policy, workers)) in all[1..].iter().zip(&PLATFORMS[1..]) {
        assert_eq!(conversations(other), first, "{policy} on {workers} workers changed a conversation");
        // Turns go out in another order across sessions (timing differs) —
        // which is what used to change the draws.
        let order = |rs: &[RequestRecord]| -> Vec<Label> { rs.iter().map(|r| r.label).collect() };
        if order(other) != order(&all[0]) {
            return;
        }
    }
    panic!("no platform sent the turns in another order: the test shows nothing");
}

#[test]
fn changing_the_output_lengths_leaves_arrivals_and_prompts_alone() {
    for (kind, params) in [
        (
            "ExponentialReqRate",
            toml! { request_rate = 20.0 total_requests = 80 prompt_size = { dist = "uniform", min = 100, max = 3000 } },
        ),
        (
            "RAGWorkload",
            toml! {
                request_rate = 20.0
                total_requests = 80
                num_documents = 40
                docs_per_request = 3
                doc_popularity_zipf = 1.0
            },
        ),
    ] {
        let with = |output: toml::Table| {
            let spec = Spec::llama8b().stage(kind, params.clone());
            spec.set("workload.stages.0.workload_params.output_tokens", output).run().requests
        };
        let a = with(toml! { dist = "uniform" min = 10 max = 50 });
        let b = with(toml! { dist = "lognormal" mean = 300 std = 200 max = 2000 });
        let arrivals_and_prompts = |rs: &[RequestRecord]| -> Vec<_> {
            rs.iter().map(|r| (r.arrival_s.to_bits(), r.prompt_hash, r.prompt_tokens)).collect()
        };
        assert_eq!(arrivals_and_prompts(&a), arrivals_and_prompts(&b), "{kind} {params}");
        assert_ne!(
            a.iter().map(|r| r.output_tokens).collect::<Vec<_>>(),
            b.iter().map(|r| r.output_tokens).collect::<Vec<_>>()
        );
    }
}
