//! The P/D decision: whether a request's prompt is prefilled on the
//! prefill pool or by its decode worker, as Dynamo's disaggregated router
//! decides it (`components/planner`/`disagg_router`: `prefill_remote =
//! prefill_length − prefix_hit_length > max_local_prefill_length and
//! queue_size < max_prefill_queue_size`): the prompt's part not cached on
//! the decode worker against `max_local_prefill_length`, and the prefill
//! queue — Dynamo's one work queue the whole prefill pool pulls from; here
//! the requests waiting on every prefill worker — against
//! `max_prefill_queue_size`. And the hand-over that follows a remote
//! prefill ([`Handover`]): facts in, actions out.

use crate::ids::WorkerId;
use crate::request::{PdPhase, Request, SeqState};
use crate::time::SimTime;

/// The rule, resolved from `[disaggregation]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdRule {
    /// Workers `0..prefill_workers` form the prefill pool; the rest decode.
    pub prefill_workers: usize,
    /// Prefill remotely only when more than this many prompt tokens are not cached on the decode worker.
    pub max_local_prefill_length: u64,
    /// Prefill locally when the prefill pool has this many requests waiting (`None`: never for this reason).
    pub max_prefill_queue_size: Option<u64>,
}

impl PdRule {
    /// Whether a prompt with `uncached` tokens not cached on its decode
    /// worker goes to the prefill pool, whose queue holds `prefill_queue` requests.
    pub fn remote(&self, uncached: u64, prefill_queue: usize) -> bool {
        let queue_ok = self.max_prefill_queue_size.is_none_or(|q| (prefill_queue as u64) < q);
        uncached > self.max_local_prefill_length && queue_ok
    }
}

/// How a remotely prefilled prompt's KV reaches its decode worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPath {
    /// Pulled over the decode worker's link from the prefill worker (vLLM's NixlConnector).
    Link,
    /// Through the shared DistributedFS tier: the hand-over waits for the
    /// prefill worker's writes, and the decode worker loads the chunks as
    /// any tier hit (LMCache's and Mooncake's stores).
    Store,
}

/// The P/D hand-over, as a state machine over a request's [`PdPhase`]: the
/// facts of a request's life come in (routed to a prefill worker, its part
/// done there, handed over), and what the cluster is to do comes out —
/// Dynamo's mocker hands a request over the same way, on facts. The
/// request's phase is its state; nothing else is kept here.
///
/// - **Routed remote**: the prefill worker is asked for one token (the
///   P/D proxies send vLLM `max_tokens = 1`); with the KV going through the
///   shared store, its writes are waited for before the hand-over.
/// - **Done on its worker** (its writes complete where waited for): a
///   prefill job is handed over, anything else answers the client.
/// - **Handed over**: the request continues on its decode worker from its
///   second token (the prefill worker's first token stands, as in SGLang's
///   and Mooncake's P/D: the decode worker computes that token's KV in its
///   first step and samples the second), its prompt's KV pulled over the
///   decode worker's link or found in the shared store; a one-token answer
///   has nothing left to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handover {
    /// How a prefilled prompt's KV reaches its decode worker.
    pub kv_path: KvPath,
}

/// What follows a request's routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routed {
    /// Count its writes, whatever the write mode, until it is handed over
    /// (its KV goes to the decode worker through the shared store).
    pub hold_writes: bool,
}

/// What follows a request's part on a worker (and its awaited writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Answer the client.
    Respond,
    /// Hand it over to its decode worker ([`Handover::hand_over`]).
    HandOver,
}

/// What a hand-over asks of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandedOver {
    /// The prefill worker it leaves (its outstanding count drops).
    pub prefill: WorkerId,
    /// The decode worker it goes to.
    pub decode: WorkerId,
    /// The pending prefill tokens it had added to its prefill worker.
    pub pending: u64,
    /// Stop counting its writes (see [`Routed::hold_writes`]).
    pub release_writes: bool,
    /// What the decode worker does with it.
    pub then: Transfer,
}

/// How a handed-over request continues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// Nothing to decode (the prefill's token was the answer): respond.
    Respond,
    /// Queued at the decode worker, which pulls the prompt's KV over its link.
    PullOverLink,
    /// Queued at the decode worker, whose lookup finds the prompt's chunks in the shared store.
    LoadFromStore,
}

impl Handover {
    /// The hand-over for prompts whose KV goes by `kv_path`.
    pub fn new(kv_path: KvPath) -> Handover {
        Handover { kv_path }
    }

    /// Fact: the router sent request `r` to a prefill worker, to continue on
    /// `decode`, adding `pending` prefill tokens there.
    pub fn routed(&self, r: &mut Request, decode: WorkerId, pending: u64) -> Routed {
        r.pd = PdPhase::Prefill { decode, output_tokens: r.output_tokens, pending };
        r.output_tokens = 1;
        Routed { hold_writes: self.kv_path == KvPath::Store }
    }

    /// Fact: request `r`'s part on its worker is done (its last token out,
    /// the writes waited for complete).
    pub fn next(r: &Request) -> Next {
        match r.pd {
            PdPhase::Prefill { .. } => Next::HandOver,
            _ => Next::Respond,
        }
    }

    /// Whether the first token of request `r` is the client's (a prefill
    /// job's is the prefill worker's, unless it was all the client asked for).
    pub fn first_token_is_clients(r: &Request) -> bool {
        !matches!(r.pd, PdPhase::Prefill { output_tokens, .. } if output_tokens > 1)
    }

    /// Fact: prefill job `r` is handed over at `now`. It becomes its decode
    /// worker's, waiting there for its prompt's KV from its second token on.
    pub fn hand_over(&self, r: &mut Request, now: SimTime) -> HandedOver {
        let PdPhase::Prefill { decode, output_tokens, pending } = r.pd else {
            unreachable!("only prefill jobs are handed over")
        };
        let prefill = r.worker.expect("a prefill job was routed");
        r.output_tokens = output_tokens;
        r.pd = PdPhase::Decode { awaiting_first_step: true };
        r.worker = Some(decode);
        r.finished = None;
        r.seq = SeqState {
            num_tokens: u64::from(r.prompt_tokens) + 1,
            generated: 1,
            // The prefill worker's token (the hand-over may come later, after
            // the prompt's writes to a shared store).
            last_token_at: r.first_token.unwrap_or(now),
            ..Default::default()
        };
        let then = if output_tokens == 1 {
            r.finished = Some(now);
            Transfer::Respond
        } else {
            match self.kv_path {
                KvPath::Link => Transfer::PullOverLink,
                KvPath::Store => Transfer::LoadFromStore,
            }
        };
        HandedOver { prefill, decode, pending, release_writes: self.kv_path == KvPath::Store, then }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: PdRule = PdRule { prefill_workers: 2, max_local_prefill_length: 1000, max_prefill_queue_size: Some(4) };

    #[test]
    fn a_prompt_goes_remote_only_beyond_the_local_length_and_below_the_queue_limit() {
        assert!(!RULE.remote(1000, 0), "exactly the local length stays local");
        assert!(RULE.remote(1001, 0));
        assert!(RULE.remote(1001, 3), "3 queued < 4");
        assert!(!RULE.remote(1001, 4), "4 queued: the prefill queue is full");
        let unbounded = PdRule { max_prefill_queue_size: None, ..RULE };
        assert!(unbounded.remote(5000, 1_000_000));
        assert!(!unbounded.remote(0, 0));
    }

    /// A request of a 100-token prompt asking for `output` tokens, routed to prefill worker 0.
    fn request(output: u32) -> Request {
        let mut content = crate::kvcache::Content::default();
        content.push(crate::kvcache::content_id("test", 1), 100);
        let new = crate::workload::NewRequest {
            stage: crate::ids::StageId(0),
            prompt_tokens: 100,
            output_tokens: output,
            content,
            output_id: 0,
            label: crate::workload::Label::None,
        };
        let mut r = Request::new(crate::ids::RequestId(0), 0, SimTime::ZERO, new);
        r.worker = Some(WorkerId(0));
        r
    }

    #[test]
    fn a_remote_prefill_asks_for_one_token_and_through_the_store_holds_its_writes() {
        let (link, store) = (Handover::new(KvPath::Link), Handover::new(KvPath::Store));
        let mut r = request(5);
        assert_eq!(Handover::next(&r), Next::Respond, "served whole: its finish answers");
        assert!(Handover::first_token_is_clients(&r));
        assert_eq!(link.routed(&mut r, WorkerId(3), 100), Routed { hold_writes: false });
        assert_eq!(r.output_tokens, 1);
        assert_eq!(r.pd, PdPhase::Prefill { decode: WorkerId(3), output_tokens: 5, pending: 100 });
        assert_eq!(Handover::next(&r), Next::HandOver);
        assert!(!Handover::first_token_is_clients(&r), "the prefill worker's token");
        assert_eq!(store.routed(&mut request(5), WorkerId(3), 100), Routed { hold_writes: true });
        // A one-token answer: the prefill worker's token is the client's.
        let mut one = request(1);
        link.routed(&mut one, WorkerId(3), 100);
        assert!(Handover::first_token_is_clients(&one));
    }

    #[test]
    fn a_handed_over_request_continues_from_its_second_token_on_its_decode_worker() {
        const MS: u64 = 1_000_000;
        for (path, then) in [(KvPath::Link, Transfer::PullOverLink), (KvPath::Store, Transfer::LoadFromStore)] {
            let h = Handover::new(path);
            let mut r = request(5);
            h.routed(&mut r, WorkerId(3), 60);
            // Its prefill worker's token came out at 3 ms; handed over at 5 ms
            // (through the store, after its writes).
            r.first_token = Some(SimTime(3 * MS));
            r.finished = Some(SimTime(3 * MS));
            let done = h.hand_over(&mut r, SimTime(5 * MS));
            let release_writes = path == KvPath::Store;
            let want = HandedOver { prefill: WorkerId(0), decode: WorkerId(3), pending: 60, release_writes, then };
            assert_eq!(done, want);
            assert_eq!((r.output_tokens, r.worker, r.finished), (5, Some(WorkerId(3)), None));
            assert_eq!(r.pd, PdPhase::Decode { awaiting_first_step: true });
            // 100 prompt tokens and the first output token; none computed here yet.
            assert_eq!((r.seq.num_tokens, r.seq.computed, r.seq.generated), (101, 0, 1));
            assert_eq!(r.seq.last_token_at, SimTime(3 * MS), "the next gap counts from the prefill's token");
            assert_eq!(Handover::next(&r), Next::Respond);
        }
        // Nothing to decode: answered at the hand-over.
        let h = Handover::new(KvPath::Link);
        let mut r = request(1);
        h.routed(&mut r, WorkerId(3), 60);
        assert_eq!(h.hand_over(&mut r, SimTime(5 * MS)).then, Transfer::Respond);
        assert_eq!(r.finished, Some(SimTime(5 * MS)));
    }
}
