//! Common random numbers: the request stream a spec and seed generate is the
//! same whatever the router, the worker count (and so the timing) — compared
//! on the requests table, request by request.

use crate::{run, scenario};
use opal::metrics::RequestRecord;
use opal::workload::Label;
use std::collections::BTreeMap;

/// Three platforms that time requests differently: one worker (queues), four
/// with round-robin, six with the KV-aware router.
const PLATFORMS: [(&str, u32); 3] = [("RoundRobin", 1), ("RoundRobin", 4), ("MaxPrefix", 6)];

fn runs(stages: &str) -> Vec<Vec<RequestRecord>> {
    PLATFORMS
        .iter()
        .map(|(policy, workers)| {
            let text = format!(
                "[simulation]\nseed = 11\nnum_workers = {workers}\n[router.router_params]\npolicy = \"{policy}\"\n[model.model_params]\nname = \"llama-3.1-8b\"\n{stages}"
            );
            run(&scenario(&text)).requests
        })
        .collect()
}

/// What an open-loop stage generates, request by request: arrival, prompt
/// content, lengths.
fn open_loop(r: &RequestRecord) -> (u32, u64, u64, u32, u32) {
    (r.stage, (r.arrival_s * 1e9).round() as u64, r.prompt_hash, r.prompt_tokens, r.output_tokens)
}

fn same_open_loop_stream(stages: &str) {
    let all = runs(stages);
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
        r#"
        [[workload.stages]]
        type = "ExponentialReqRate"
        [workload.stages.workload_params]
        request_rate = 30.0
        total_requests = 120
        prompt_size = { dist = "lognormal", mean = 1500, std = 800, max = 6000 }
        output_tokens = { dist = "uniform", min = 10, max = 200 }
        "#,
    );
}

#[test]
fn trace_stages_generate_the_same_stream_on_any_platform() {
    same_open_loop_stream(
        r#"
        [[workload.stages]]
        type = "Trace"
        [workload.stages.workload_params]
        trace_file = "traces/conversation_trace.jsonl"
        total_requests = 150
        time_scale = 0.05
        "#,
    );
}

#[test]
fn rag_stages_generate_the_same_stream_on_any_platform() {
    same_open_loop_stream(
        r#"
        [[workload.stages]]
        type = "RAGWorkload"
        [workload.stages.workload_params]
        request_rate = 20.0
        total_requests = 120
        num_documents = 50
        docs_per_request = 5
        document_size = 300
        doc_popularity_zipf = 1.1
        output_tokens = { dist = "uniform", min = 10, max = 100 }
        max_outstanding_requests = 1000
        "#,
    );
}

#[test]
fn sc25_stages_send_the_same_prompts_in_the_same_order_on_any_platform() {
    let all = runs(
        "[[workload.stages]]\ntype = \"SC25Workload\"\n[workload.stages.workload_params]\nprompt_sizes = [1000, 5000, 20000]\n",
    );
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
        r#"
        [[workload.stages]]
        type = "Sessions"
        [workload.stages.workload_params]
        session_rate = 4.0
        total_sessions = 25
        turns = { dist = "uniform", min = 1, max = 6 }
        input_tokens = { dist = "uniform", min = 50, max = 800 }
        output_tokens = { dist = "lognormal", mean = 150, std = 100, max = 600 }
        think_time_sec = { dist = "exponential", mean = 1.5 }
        "#,
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
    for stage in [
        "type = \"ExponentialReqRate\"\n[workload.stages.workload_params]\nrequest_rate = 20.0\ntotal_requests = 80\nprompt_size = { dist = \"uniform\", min = 100, max = 3000 }\n",
        "type = \"RAGWorkload\"\n[workload.stages.workload_params]\nrequest_rate = 20.0\ntotal_requests = 80\nnum_documents = 40\ndocs_per_request = 3\ndoc_popularity_zipf = 1.0\n",
    ] {
        let with = |output: &str| {
            let text = format!(
                "[model.model_params]\nname = \"llama-3.1-8b\"\n[[workload.stages]]\n{stage}output_tokens = {output}\n"
            );
            run(&scenario(&text)).requests
        };
        let a = with("{ dist = \"uniform\", min = 10, max = 50 }");
        let b = with("{ dist = \"lognormal\", mean = 300, std = 200, max = 2000 }");
        let arrivals_and_prompts = |rs: &[RequestRecord]| -> Vec<_> {
            rs.iter().map(|r| (r.arrival_s.to_bits(), r.prompt_hash, r.prompt_tokens)).collect()
        };
        assert_eq!(arrivals_and_prompts(&a), arrivals_and_prompts(&b), "{stage}");
        assert_ne!(
            a.iter().map(|r| r.output_tokens).collect::<Vec<_>>(),
            b.iter().map(|r| r.output_tokens).collect::<Vec<_>>()
        );
    }
}
