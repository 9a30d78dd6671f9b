//! `RAGWorkload`: retrieval-augmented generation. Every prompt is the
//! stage's system prompt, then `docs_per_request` distinct documents of a
//! corpus of `num_documents` in ascending id order (so the same set always
//! forms the same prefix), then a question unique to the request
//! (`query_size` tokens). Documents are chosen uniformly, or by popularity
//! rank with a Zipf law of exponent `doc_popularity_zipf` (> 0: document 0
//! is the most popular). Arrivals are Opal's jittered exponential gaps;
//! `max_concurrent_requests` caps the requests in flight.

use super::arrivals::{ArrivalProcess, Arrivals};
use super::dist::Dist;
use super::{Due, Emit, Generator, Label};
use crate::kvcache::{Content, content_id};
use crate::rng::{SeedTree, StreamRng};
use crate::time::SimTime;
use rand::RngExt;
use rand::seq::index;
use rand_distr::{Distribution, Zipf};

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

/// The generator.
#[derive(Debug)]
pub(crate) struct RagSource {
    cfg: RagStage,
    stage: u64,
    docs: StreamRng,
    arrivals: Arrivals,
    sent: u64,
    chosen: Vec<u32>,
    /// Document popularity (`None`: uniform).
    zipf: Option<Zipf<f64>>,
}

impl RagSource {
    /// Documents are drawn from `workload.stage<i>.documents`, gaps from `workload.stage<i>.arrivals`.
    pub fn new(cfg: &RagStage, stage: usize, seeds: &SeedTree) -> RagSource {
        let process = ArrivalProcess::Exponential { jitter: cfg.jitter };
        RagSource {
            cfg: cfg.clone(),
            stage: stage as u64,
            docs: seeds.stream(&format!("workload.stage{stage}.documents")),
            arrivals: Arrivals::new(process, cfg.rate, seeds.stream(&format!("workload.stage{stage}.arrivals"))),
            sent: 0,
            chosen: Vec::new(),
            zipf: (cfg.zipf > 0.0)
                .then(|| Zipf::new(f64::from(cfg.num_documents), cfg.zipf).expect("validated: n ≥ 1, exponent > 0")),
        }
    }

    /// Picks `docs_per_request` distinct documents, sorted.
    fn choose(&mut self) {
        let (n, k) = (self.cfg.num_documents, self.cfg.docs_per_request);
        self.chosen.clear();
        if let Some(zipf) = &self.zipf {
            while self.chosen.len() < k as usize {
                let d = zipf.sample(&mut self.docs) as u32 - 1;
                if !self.chosen.contains(&d) {
                    self.chosen.push(d);
                }
            }
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
        Ok(Due::At(self.arrivals.start(now)))
    }

    fn emit(&mut self, now: SimTime, room: u64, out: &mut Emit<'_>) -> Result<Due, String> {
        if room == 0 || self.arrivals.due() > now {
            return Ok(Due::At(self.arrivals.due()));
        }
        self.choose();
        let mut content = Content::default();
        content.push(content_id("rag-system", self.stage), self.cfg.system_prompt_size);
        for &d in &self.chosen {
            content.push(content_id("rag-doc", (self.stage << 32) | u64::from(d)), self.cfg.document_size);
        }
        content.push(content_id("rag-query", out.key()), self.cfg.query_size);
        let prompt = content.tokens() as u32;
        let output = self.cfg.output_tokens.sample_tokens(&mut self.docs);
        out.push(prompt, output, content, Label::None);
        self.sent += 1;
        if self.cfg.total.is_some_and(|t| self.sent >= t) {
            Ok(Due::Done)
        } else {
            Ok(Due::At(self.arrivals.advance(now)))
        }
    }
}
