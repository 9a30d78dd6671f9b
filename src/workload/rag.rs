//! `RAGWorkload`: retrieval-augmented generation. Every prompt is the
//! stage's system prompt, then `docs_per_request` distinct documents of a
//! corpus of `num_documents` in ascending id order (so the same set always
//! forms the same prefix), then a question unique to the request
//! (`query_size` tokens). Documents are chosen uniformly, or by popularity
//! rank with a Zipf law of exponent `doc_popularity_zipf` (> 0: document 0
//! is the most popular). Arrivals are Opal's jittered exponential gaps;
//! `max_outstanding_requests` caps the requests in flight.

use super::arrivals::{ArrivalProcess, Arrivals, OpenLoop};
use super::dist::Dist;
use super::{Due, Emit, Generator, Label};
use crate::kvcache::{Content, content_id};
use crate::rng::{SeedTree, StreamRng};
use crate::time::SimTime;
use rand::RngExt;
use rand::seq::index;
use rand_distr::{Distribution, Exp1};

/// A resolved `RAGWorkload` stage.
#[derive(Clone, Debug, PartialEq)]
pub struct RagStage {
    /// Requests per second.
    pub rate: f64,
    /// 0 = fixed gaps, 1 = Poisson.
    pub jitter: f64,
    /// Requests to generate (`None` = until a time limit).
    pub total: Option<u64>,
    /// Tokens of the system prompt shared by every request.
    pub system_prompt_size: u32,
    /// Documents in the corpus.
    pub num_documents: u32,
    /// Tokens per document.
    pub document_size: u32,
    /// Distinct documents per request.
    pub docs_per_request: u32,
    /// Tokens of the request's own question, after the documents.
    pub query_size: u32,
    /// Output tokens.
    pub output_tokens: Dist,
    /// Zipf exponent of document popularity (0 = uniform).
    pub zipf: f64,
}

impl RagStage {
    /// Prompt tokens of every request.
    pub fn prompt_tokens(&self) -> u64 {
        u64::from(self.system_prompt_size)
            + u64::from(self.docs_per_request) * u64::from(self.document_size)
            + u64::from(self.query_size)
    }
}

/// Documents drawn by Zipf popularity, distinct within a request: document
/// `d` has weight `(d + 1)^−s`; the first is drawn with probability
/// proportional to its weight, each next one likewise among those not yet
/// drawn (successive sampling without replacement — the law that drawing
/// with replacement and discarding repeats gives, without its cost, which
/// grows without bound as `docs_per_request` nears `num_documents` under a
/// steep exponent). Two exact methods, chosen by cost from the
/// configuration alone (so a spec always draws the same way):
///
/// - a few documents of many: the weights live in a Fenwick tree; a draw
///   is a descent by a uniform variate over the remaining mass, O(log n); a
///   drawn document's weight is taken out for the rest of the request, and
///   the nodes that changed are copied back from the untouched tree after
///   it (so every request starts from bit-identical sums: no rounding
///   drift); O(k log n) per request;
/// - many of few (k log₂ n above n/4): every document gets the key
///   `Exp(1) / w` and the `k` smallest keys win (Efraimidis and Spirakis,
///   "Weighted random sampling with a reservoir", IPL 97(5), 2006: the
///   order of the keys is a successive-sampling order); O(n) per request.
#[derive(Clone, Debug)]
struct ZipfDocs {
    weight: Vec<f64>,
    /// 1-based Fenwick tree of the current weights.
    tree: Vec<f64>,
    /// The tree with every weight in.
    pristine: Vec<f64>,
    total: f64,
    taken: Vec<bool>,
    /// Draw by keys rather than by descents.
    by_keys: bool,
    keys: Vec<(f64, u32)>,
}

impl ZipfDocs {
    fn new(n: u32, k: u32, exponent: f64) -> ZipfDocs {
        let weight: Vec<f64> = (1..=n).map(|r| f64::from(r).powf(-exponent)).collect();
        // Linear-time construction: each node adds itself to its parent.
        let mut tree = vec![0.0; weight.len() + 1];
        for i in 1..tree.len() {
            tree[i] += weight[i - 1];
            let parent = i + (i & i.wrapping_neg());
            if parent < tree.len() {
                tree[parent] += tree[i];
            }
        }
        let total = weight.iter().sum();
        let by_keys = f64::from(k) * f64::from(n).log2() > f64::from(n) / 4.0;
        ZipfDocs {
            taken: vec![false; weight.len()],
            weight,
            pristine: tree.clone(),
            tree,
            total,
            by_keys,
            keys: Vec::new(),
        }
    }

    fn add(&mut self, d: usize, delta: f64) {
        let mut i = d + 1;
        while i < self.tree.len() {
            self.tree[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// The document at which the running sum of current weights reaches `u`.
    fn find(&self, mut u: f64) -> usize {
        let n = self.tree.len() - 1;
        let mut pos = 0;
        let mut step = n.next_power_of_two();
        while step > 0 {
            let next = pos + step;
            if next <= n && self.tree[next] < u {
                pos = next;
                u -= self.tree[next];
            }
            step /= 2;
        }
        pos
    }

    /// Appends `k` distinct documents to `out`.
    fn choose(&mut self, k: u32, rng: &mut StreamRng, out: &mut Vec<u32>) {
        if self.by_keys {
            self.keys.clear();
            self.keys.extend(self.weight.iter().enumerate().map(|(d, w)| {
                let e: f64 = Exp1.sample(rng);
                (e / w, d as u32)
            }));
            let k = k as usize;
            if k < self.keys.len() {
                self.keys.select_nth_unstable_by(k, |a, b| a.0.total_cmp(&b.0));
            }
            out.extend(self.keys[..k].iter().map(|&(_, d)| d));
            return;
        }
        let mut remaining = self.total;
        for _ in 0..k {
            let d = loop {
                // u in (0, remaining]; a rounding overshoot (past the end, or
                // onto a document already taken) draws again.
                let u = (1.0 - rng.random::<f64>()) * remaining;
                let d = self.find(u);
                if d < self.weight.len() && !self.taken[d] {
                    break d;
                }
            };
            self.taken[d] = true;
            self.add(d, -self.weight[d]);
            remaining -= self.weight[d];
            out.push(d as u32);
        }
        for &d in out.iter() {
            self.taken[d as usize] = false;
            let mut i = d as usize + 1;
            while i < self.tree.len() {
                self.tree[i] = self.pristine[i];
                i += i & i.wrapping_neg();
            }
        }
    }
}

/// The generator.
#[derive(Debug)]
pub(crate) struct RagSource {
    cfg: RagStage,
    stage: u64,
    docs: StreamRng,
    outputs: StreamRng,
    clock: OpenLoop,
    chosen: Vec<u32>,
    /// Document popularity (`None`: uniform).
    zipf: Option<ZipfDocs>,
}

impl RagSource {
    /// Each quantity has its own stream, drawn in request order: gaps from
    /// `workload.stage<i>.arrivals`, documents from `….documents`, output
    /// lengths from `….output_lengths`.
    pub fn new(cfg: &RagStage, stage: usize, seeds: &SeedTree) -> RagSource {
        let process = ArrivalProcess::Exponential { jitter: cfg.jitter };
        let stream = |what: &str| seeds.stream(&format!("workload.stage{stage}.{what}"));
        RagSource {
            cfg: cfg.clone(),
            stage: stage as u64,
            docs: stream("documents"),
            outputs: stream("output_lengths"),
            clock: OpenLoop::new(Arrivals::new(process, cfg.rate, stream("arrivals")), cfg.total),
            chosen: Vec::new(),
            zipf: (cfg.zipf > 0.0).then(|| ZipfDocs::new(cfg.num_documents, cfg.docs_per_request, cfg.zipf)),
        }
    }

    /// Picks `docs_per_request` distinct documents, sorted.
    fn choose(&mut self) {
        let (n, k) = (self.cfg.num_documents, self.cfg.docs_per_request);
        self.chosen.clear();
        if let Some(zipf) = &mut self.zipf {
            zipf.choose(k, &mut self.docs, &mut self.chosen);
        } else if k * 4 < n {
            // Few of many: rejection is cheaper than a partial shuffle.
            while self.chosen.len() < k as usize {
                let d = self.docs.random_range(0..n);
                if !self.chosen.contains(&d) {
                    self.chosen.push(d);
                }
            }
        } else {
            self.chosen.extend(index::sample(&mut self.docs, n as usize, k as usize).iter().map(|d| d as u32));
        }
        self.chosen.sort_unstable();
    }
}

impl Generator for RagSource {
    fn start(&mut self, now: SimTime) -> Result<Due, String> {
        Ok(self.clock.start(now))
    }

    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String> {
        if !self.clock.ready(now, room) {
            return Ok(self.clock.next());
        }
        self.choose();
        let mut content = Content::default();
        content.push(content_id("rag-system", self.stage), self.cfg.system_prompt_size);
        for &d in &self.chosen {
            content.push(content_id("rag-doc", (self.stage << 32) | u64::from(d)), self.cfg.document_size);
        }
        content.push(content_id("rag-query", out.key()), self.cfg.query_size);
        let prompt = content.tokens() as u32;
        let output = self.cfg.output_tokens.sample_tokens(&mut self.outputs);
        out.push(prompt, output, content, Label::None);
        Ok(self.clock.sent(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pearson's statistic of `observed` counts against probabilities `p`.
    fn chi_square(observed: &[u64], p: &[f64]) -> f64 {
        let n: u64 = observed.iter().sum();
        observed.iter().zip(p).map(|(&o, &p)| (o as f64 - n as f64 * p).powi(2) / (n as f64 * p)).sum()
    }

    #[test]
    fn single_documents_follow_the_zipf_law() {
        // 20 documents, exponent 1.2: P(rank r) = r^−1.2 / Σ k^−1.2.
        let (n, s) = (20u32, 1.2);
        let mut docs = ZipfDocs::new(n, 1, s);
        assert!(!docs.by_keys);
        let mut rng = SeedTree::new(5).stream("zipf");
        let mut seen = vec![0u64; n as usize];
        let mut out = Vec::new();
        for _ in 0..100_000 {
            out.clear();
            docs.choose(1, &mut rng, &mut out);
            seen[out[0] as usize] += 1;
        }
        let h: f64 = (1..=n).map(|r| f64::from(r).powf(-s)).sum();
        let p: Vec<f64> = (1..=n).map(|r| f64::from(r).powf(-s) / h).collect();
        // 19 degrees of freedom: P(χ² > 43.8) = 0.001.
        let x = chi_square(&seen, &p);
        assert!(x < 43.8, "χ² = {x}: {seen:?}");
    }

    #[test]
    fn all_but_one_document_leave_out_the_one_successive_sampling_predicts() {
        // 5 documents, exponent 2, 4 per request: which one is left out. The
        // law, independently: sum over every order of drawing (5! of them)
        // of Π w(next) / (mass not yet drawn), by the order's last document.
        let (n, s) = (5u32, 2.0);
        let w: Vec<f64> = (1..=n).map(|r| f64::from(r).powf(-s)).collect();
        let mut p_left_out = vec![0.0; n as usize];
        let mut order: Vec<usize> = (0..n as usize).collect();
        fn permute(k: usize, order: &mut Vec<usize>, w: &[f64], acc: &mut [f64]) {
            if k == order.len() {
                let mut left = w.iter().sum::<f64>();
                let mut p = 1.0;
                for &d in &order[..order.len() - 1] {
                    p *= w[d] / left;
                    left -= w[d];
                }
                acc[*order.last().unwrap()] += p;
                return;
            }
            for i in k..order.len() {
                order.swap(k, i);
                permute(k + 1, order, w, acc);
                order.swap(k, i);
            }
        }
        permute(0, &mut order, &w, &mut p_left_out);
        assert!((p_left_out.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        for by_keys in [false, true] {
            let mut docs = ZipfDocs::new(n, n - 1, s);
            assert!(docs.by_keys, "many of few: keys");
            docs.by_keys = by_keys;
            let mut rng = SeedTree::new(8).stream("zipf");
            let mut seen = vec![0u64; n as usize];
            let mut out = Vec::new();
            for _ in 0..100_000 {
                out.clear();
                docs.choose(n - 1, &mut rng, &mut out);
                let mut sorted = out.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), (n - 1) as usize, "distinct");
                let missing = (0..n).find(|d| !out.contains(d)).unwrap();
                seen[missing as usize] += 1;
            }
            // 4 degrees of freedom: P(χ² > 18.47) = 0.001.
            let x = chi_square(&seen, &p_left_out);
            assert!(x < 18.47, "χ² = {x}: {seen:?} vs {p_left_out:?}");
            // The tree is back to its weights after every request, bit for bit.
            assert!(docs.tree == docs.pristine && docs.taken.iter().all(|t| !t));
        }
    }
}
