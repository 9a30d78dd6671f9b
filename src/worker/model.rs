//! Model architectures, read from a Hugging Face `config.json`, and the
//! numbers the simulator derives from them: parameters (total and active),
//! weight bytes, KV bytes per token, and the per-step quantities the roofline
//! step model needs.
//!
//! Families (by `model_type`; a family the file does not belong to is refused
//! with the list of those that are modelled, never sized as something else):
//!
//! - **dense** decoder-only transformers with grouped-query (or multi-head,
//!   multi-query) attention and a gated MLP: Llama, Mistral, Qwen2/3,
//!   Granite, Gemma 2/3;
//! - **mixture of experts**: Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V2/V3,
//!   gpt-oss, Llama 4 — every expert is resident in GPU memory; a token uses
//!   `k` of the `E` routed experts (plus any shared experts);
//! - **multi-head latent attention** (DeepSeek-V2/V3): the KV cache holds the
//!   compressed latent and the decoupled RoPE key, `kv_lora_rank +
//!   qk_rope_head_dim` values per layer and token (as vLLM stores it);
//! - **sliding-window / hybrid attention** (Gemma 2/3, gpt-oss, Mistral with a
//!   window): windowed layers attend to, and read, at most `sliding_window`
//!   tokens of KV. Llama 4's chunked attention (a token attends within its
//!   `attention_chunk_size` chunk) is treated as a window of that size — an
//!   upper bound: on average a token sees half a chunk.
//!
//! Strict: a field the family needs and the file lacks is an error naming
//! it. Where a field is optional in the Hugging Face class (`head_dim`,
//! `num_key_value_heads`, `tie_word_embeddings`, …) its documented default is
//! the family's definition and is used.
//!
//! Simplification: the GPU KV pool counts windowed layers as if they held
//! the whole context (as vLLM does without its hybrid allocator), so for
//! contexts much longer than the window the pool is conservative by up to
//! `kv_bytes_per_token / kv_bytes_per_token_full`; step times and KV reads use
//! the window.

/// The attention of every layer.
#[derive(Clone, Debug, PartialEq)]
pub enum Attention {
    /// Grouped-query attention (multi-head when `kv_heads == heads`).
    Gqa {
        /// Query heads.
        heads: u64,
        /// Key/value heads.
        kv_heads: u64,
        /// Dimension of each head.
        head_dim: u64,
        /// Biases on the q, k and v projections.
        qkv_bias: bool,
        /// Bias on the output projection.
        o_bias: bool,
        /// RMSNorm on queries and keys (Qwen3, Gemma 3): 2 × head_dim parameters.
        qk_norm: bool,
        /// One learned attention-sink logit per head (gpt-oss).
        sinks: bool,
    },
    /// Multi-head latent attention (DeepSeek-V2/V3).
    Mla {
        /// Query heads.
        heads: u64,
        /// Rank of the query compression (`None`: queries are projected directly).
        q_lora_rank: Option<u64>,
        /// Rank of the key/value compression: the latent the cache holds.
        kv_lora_rank: u64,
        /// Per-head query/key dimension without RoPE.
        qk_nope_head_dim: u64,
        /// Per-head query/key dimension with RoPE (the key part is shared by the heads and cached).
        qk_rope_head_dim: u64,
        /// Per-head value dimension.
        v_head_dim: u64,
    },
}

/// The routed experts of a mixture-of-experts model.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    /// Layers whose MLP is a mixture of experts (the others have a dense MLP).
    pub layers: u64,
    /// Routed experts per MoE layer (E).
    pub experts: u64,
    /// Experts each token is routed to (k).
    pub active: u64,
    /// MLP width of one routed expert.
    pub expert_intermediate: u64,
    /// MLP width of the shared experts of a MoE layer together (0: none).
    pub shared_intermediate: u64,
    /// A sigmoid gate on the shared expert's output (Qwen2-MoE): d parameters.
    pub shared_gate: bool,
    /// Bias on the router (gpt-oss; DeepSeek-V3's score-correction bias): E parameters.
    pub router_bias: bool,
    /// Biases inside each expert (gpt-oss): 2F + d parameters per expert.
    pub expert_bias: bool,
}

/// How an engine's GPUs hold the model: `tp` GPUs per engine, the routed
/// experts whole on `ep` of them (1: each expert split), and `dp` engines
/// stepping together with data-parallel attention, whose routed experts
/// then span the `dp · tp` GPUs of all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sharding {
    /// Tensor-parallel GPUs of one engine.
    pub tp: u32,
    /// GPUs the routed experts are sharded over whole (1: none).
    pub ep: u32,
    /// Data-parallel attention ranks stepping together (1: none).
    pub dp: u32,
}

impl Sharding {
    /// `tp` GPUs, nothing else sharded.
    pub const fn tensor(tp: u32) -> Sharding {
        Sharding { tp, ep: 1, dp: 1 }
    }

    /// The split of one routed expert's GEMMs: (its width over GPUs, the
    /// experts over GPUs). With expert parallelism each GPU holds whole
    /// experts; without, every expert is split over all the GPUs the
    /// experts span — the engine's `tp`, or with data-parallel attention
    /// `dp · tp` (vLLM's `FusedMoEParallelConfig.make`: the MoE layers' TP
    /// size is `dp_size · tp_size` when expert parallelism is off).
    pub fn expert_split(&self) -> (u64, u64) {
        if self.ep > 1 { (1, u64::from(self.ep)) } else { (u64::from(self.tp) * u64::from(self.dp), 1) }
    }
}

/// Which weights a quantisation method stores in fewer bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantization {
    /// `quantization_config.quant_method`.
    pub method: String,
    /// Bytes per quantised parameter, scales included.
    pub bytes_per_param: f64,
    /// Attention projections are quantised too (not only the MLPs and experts).
    pub attention: bool,
    /// Dense MLPs and shared experts are quantised too (not only the routed experts).
    pub dense_mlp: bool,
    /// Layers whose MLP `modules_to_not_convert` keeps unquantised.
    pub mlp_layers_kept: u64,
    /// FP8 with a scale per weight block (`weight_block_size`).
    pub block_scaled: bool,
}

/// A model's architecture: everything the simulator needs from its `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArch {
    /// Canonical name (the preset name or the config file's path).
    pub name: String,
    /// `model_type` of the config.
    pub model_type: String,
    /// Transformer layers (`num_hidden_layers`).
    pub num_layers: u64,
    /// Model width d (`hidden_size`).
    pub hidden_size: u64,
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Whether the output projection shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// RMSNorms per layer (2; 4 for Gemma 2/3).
    pub norms_per_layer: u64,
    /// Attention.
    pub attention: Attention,
    /// `(window tokens, windowed layers)` of sliding-window attention.
    pub window: Option<(u64, u64)>,
    /// MLP width of the dense (non-MoE) layers.
    pub intermediate_size: u64,
    /// Routed experts, for a mixture-of-experts model.
    pub moe: Option<Moe>,
    /// Bytes per weight (`torch_dtype` / `dtype`) where not quantised.
    pub dtype_bytes: u64,
    /// Weight quantisation (`quantization_config`).
    pub quantization: Option<Quantization>,
    /// Bytes per KV-cache element (the weight dtype's, or 1 with an FP8 KV cache).
    pub kv_dtype_bytes: u64,
    /// Longest sequence the model accepts (`max_position_embeddings`).
    pub max_model_len: u64,
}

/// The decoder layers each of `pp` stages holds, as vLLM's
/// `get_pp_indices` splits `layers` (`vllm/distributed/utils.py`, since
/// #13839): `⌊layers / pp⌋` each, and the remainder one each to stages
/// `pp − 2, pp − 3, …` — the last stage, which also runs the LM head,
/// never takes one (with `pp` = 1, the whole model).
pub fn partition(layers: u64, pp: u64) -> Vec<u64> {
    let pp = pp.max(1);
    let mut parts = vec![layers / pp; pp as usize];
    let n = parts.len();
    for i in 0..(layers % pp) as usize {
        // `remaining ≤ pp − 1`, so `n − 2 − i` stays ≥ 0.
        parts[n - 2 - i] += 1;
    }
    parts
}

/// `E·(1 − (1 − k/E)^T)`: expected distinct experts of `E` that `tokens`
/// tokens routed to `k` experts each touch, with independent uniform routing.
pub fn expected_experts(experts: u64, active: u64, tokens: f64) -> f64 {
    let e = experts as f64;
    e * (1.0 - (1.0 - active as f64 / e).powf(tokens))
}

impl ModelArch {
    /// Sets the KV-cache element type as vLLM's `--kv-cache-dtype`: `auto`
    /// (the weights' dtype) or `fp8` (`fp8_e4m3`, `fp8_e5m2`): 1 byte.
    pub fn set_kv_cache_dtype(&mut self, name: &str) -> Result<(), String> {
        self.kv_dtype_bytes = match name.to_ascii_lowercase().as_str() {
            "auto" => self.dtype_bytes,
            "fp8" | "fp8_e4m3" | "fp8_e5m2" => 1,
            other => return Err(format!("unknown KV-cache dtype {other:?}; use auto (the model's dtype) or fp8")),
        };
        Ok(())
    }

    /// "dense" or "moe".
    pub fn family(&self) -> &'static str {
        if self.moe.is_some() { "moe" } else { "dense" }
    }

    /// "gqa", "mla", with "+sliding-window" when some layers are windowed.
    pub fn attention_kind(&self) -> String {
        let base = match self.attention {
            Attention::Gqa { .. } => "gqa",
            Attention::Mla { .. } => "mla",
        };
        if self.window.is_some() { format!("{base}+sliding-window") } else { base.to_string() }
    }

    fn d(&self) -> u64 {
        self.hidden_size
    }

    /// Why `tp` GPUs cannot split this model's attention (`None`: they
    /// can). vLLM refuses the same (`ModelConfig.verify_with_parallel_config`,
    /// `vllm/config/model.py`): "Total number of attention heads (…) must be
    /// divisible by tensor parallel size (…)".
    pub fn tp_problem(&self, tp: u64) -> Option<String> {
        let heads = match self.attention {
            Attention::Gqa { heads, .. } | Attention::Mla { heads, .. } => heads,
        };
        (tp == 0 || heads % tp != 0).then(|| {
            let fit: Vec<String> = (1..=heads.min(64)).filter(|t| heads % t == 0).map(|t| t.to_string()).collect();
            format!(
                "{} has {heads} attention heads, which {tp} GPUs cannot split evenly (vLLM requires the head count to be divisible by the tensor-parallel size); degrees that divide it: {}",
                self.name,
                fit.join(", ")
            )
        })
    }

    /// Weights of one layer's attention projections.
    pub fn attention_linear_params(&self) -> u64 {
        let d = self.d();
        match self.attention {
            Attention::Gqa { heads, kv_heads, head_dim, .. } => {
                let (q, kv) = (heads * head_dim, kv_heads * head_dim);
                d * q + 2 * d * kv + q * d
            }
            Attention::Mla { heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
                let qk = qk_nope_head_dim + qk_rope_head_dim;
                let q = match q_lora_rank {
                    Some(r) => d * r + r * heads * qk,
                    None => d * heads * qk,
                };
                q + d * (kv_lora_rank + qk_rope_head_dim)
                    + kv_lora_rank * heads * (qk_nope_head_dim + v_head_dim)
                    + heads * v_head_dim * d
            }
        }
    }

    /// One layer's attention parameters that are not projection weights:
    /// biases, q/k norms, sinks, MLA's latent norms.
    fn attention_other_params(&self) -> u64 {
        match self.attention {
            Attention::Gqa { heads, kv_heads, head_dim, qkv_bias, o_bias, qk_norm, sinks } => {
                let mut n = 0;
                if qkv_bias {
                    n += heads * head_dim + 2 * kv_heads * head_dim;
                }
                if o_bias {
                    n += self.d();
                }
                if qk_norm {
                    n += 2 * head_dim;
                }
                if sinks {
                    n += heads;
                }
                n
            }
            Attention::Mla { q_lora_rank, kv_lora_rank, .. } => q_lora_rank.unwrap_or(0) + kv_lora_rank,
        }
    }

    /// Weights of a gated MLP of width `f`.
    fn mlp_params(&self, f: u64) -> u64 {
        3 * self.d() * f
    }

    /// Parameters of one routed expert (weights and, for gpt-oss, biases).
    fn expert_params(&self, m: &Moe) -> u64 {
        self.mlp_params(m.expert_intermediate) + if m.expert_bias { 2 * m.expert_intermediate + self.d() } else { 0 }
    }

    /// Parameters of a MoE layer's MLP other than the routed experts:
    /// shared experts, their gate, the router.
    fn moe_fixed_params(&self, m: &Moe) -> u64 {
        self.mlp_params(m.shared_intermediate)
            + if m.shared_gate { self.d() } else { 0 }
            + self.d() * m.experts
            + if m.router_bias { m.experts } else { 0 }
    }

    fn dense_layers(&self) -> u64 {
        self.num_layers - self.moe.as_ref().map_or(0, |m| m.layers)
    }

    fn embedding_params(&self) -> u64 {
        self.vocab_size * self.d() * if self.tie_word_embeddings { 1 } else { 2 }
    }

    /// Every parameter: embeddings (and an untied output projection),
    /// attention, MLPs with every expert, norms.
    pub fn parameter_count(&self) -> u64 {
        let per_layer_attn = self.attention_linear_params() + self.attention_other_params();
        let norms = self.norms_per_layer * self.d() * self.num_layers + self.d();
        let dense = self.dense_layers() * self.mlp_params(self.intermediate_size);
        let moe =
            self.moe.as_ref().map_or(0, |m| m.layers * (m.experts * self.expert_params(m) + self.moe_fixed_params(m)));
        self.embedding_params() + self.num_layers * per_layer_attn + dense + moe + norms
    }

    /// Parameters one token uses: all but the routed experts it is not sent
    /// to (embeddings included, as model cards count them).
    pub fn active_parameter_count(&self) -> u64 {
        let idle = self.moe.as_ref().map_or(0, |m| m.layers * (m.experts - m.active) * self.expert_params(m));
        self.parameter_count() - idle
    }

    /// Parameters stored quantised.
    fn quantized_params(&self) -> u64 {
        let Some(q) = &self.quantization else { return 0 };
        let mut n = 0;
        if q.attention {
            n += self.num_layers * self.attention_linear_params();
        }
        let kept = q.mlp_layers_kept;
        match &self.moe {
            Some(m) => {
                let moe_layers = m.layers.saturating_sub(kept);
                n += moe_layers * m.experts * self.mlp_params(m.expert_intermediate);
                if q.dense_mlp {
                    n += moe_layers * self.mlp_params(m.shared_intermediate);
                    n += self.dense_layers().saturating_sub(kept.saturating_sub(m.layers))
                        * self.mlp_params(self.intermediate_size);
                }
            }
            None => n += self.num_layers.saturating_sub(kept) * self.mlp_params(self.intermediate_size),
        }
        n
    }

    /// Bytes of weights held on the GPUs (all tensor-parallel ranks together).
    pub fn weight_bytes(&self) -> u64 {
        let q = self.quantized_params();
        let per = self.quantization.as_ref().map_or(0.0, |q| q.bytes_per_param);
        (self.parameter_count() - q) * self.dtype_bytes + (q as f64 * per).round() as u64
    }

    /// Bytes of weights a pipeline stage holds over its TP ranks: decoder
    /// layers `first .. first + n` (each layer's share of the layers' bytes
    /// by its parameters: MoE models' dense layers come first, as
    /// DeepSeek-V3's `first_k_dense_replace`), the token embedding on the
    /// first stage, and on the last the final norm and the LM head — a copy
    /// of the embedding when they are tied and there is more than one stage
    /// (vLLM's `LlamaModel.__init__` builds `embed_tokens` on the last rank
    /// then too). Over the whole model in one stage, [`Self::weight_bytes`].
    pub fn stage_weight_bytes(&self, first: u64, n: u64, stages: u64) -> u64 {
        let embedding = self.vocab_size * self.d();
        let outside = (self.embedding_params() + self.d()) * self.dtype_bytes;
        let layers_bytes = u128::from(self.weight_bytes() - outside);
        let per = |i: u64| -> u128 {
            let mlp = match &self.moe {
                Some(m) if i >= self.dense_layers() => m.experts * self.expert_params(m) + self.moe_fixed_params(m),
                _ => self.mlp_params(self.intermediate_size),
            };
            u128::from(
                self.attention_linear_params() + self.attention_other_params() + self.norms_per_layer * self.d() + mlp,
            )
        };
        let all: u128 = (0..self.num_layers).map(per).sum();
        let mine: u128 = (first..first + n).map(per).sum();
        let mut bytes = (layers_bytes * mine / all.max(1)) as u64;
        let last = first + n == self.num_layers;
        if first == 0 {
            bytes += embedding * self.dtype_bytes;
        }
        if last {
            let head = if !self.tie_word_embeddings || stages > 1 { embedding } else { 0 };
            bytes += (head + self.d()) * self.dtype_bytes;
        }
        bytes
    }

    /// Bytes beyond [`Self::weight_bytes`] that sharding the routed experts
    /// over `ep` GPUs costs, counted as if every GPU held as many experts as
    /// the busiest: vLLM places `E/ep` experts on each rank and one more on
    /// each of the first `E mod ep` (`determine_expert_map`,
    /// `vllm/model_executor/layers/fused_moe/layer.py`), and the KV pool is
    /// the busiest rank's. 0 for a dense model or an even split.
    pub fn expert_parallel_padding_bytes(&self, ep: u64) -> u64 {
        let Some(m) = &self.moe else { return 0 };
        let spare = m.experts.div_ceil(ep) * ep - m.experts;
        (m.layers as f64 * spare as f64 * self.expert_bytes()).round() as u64
    }

    /// The drafter of an EAGLE head or a multi-token-prediction module on
    /// this model, and the bytes of weights it adds. One decoder layer like
    /// the model's last (a mixture of experts if that is one), with full
    /// attention, sharing the model's embedding and LM head — vLLM's EAGLE
    /// and DeepSeek-MTP drafters take both from the target
    /// (`vllm/v1/spec_decode/eagle.py`, `load_model`) — so it adds that
    /// layer, its norms, and the projection fusing a token's embedding with
    /// the target's hidden state (2d × d: EAGLE's `fc`, MTP's `eh_proj`).
    pub fn draft_head(&self) -> (ModelArch, u64) {
        let mut head = self.clone();
        head.name = format!("{} draft head", self.name);
        head.num_layers = 1;
        head.window = None;
        if let Some(m) = &mut head.moe {
            m.layers = 1;
        }
        let shared = (head.embedding_params() + head.d()) * head.dtype_bytes;
        let added = head.weight_bytes() - shared + 2 * head.d() * head.d() * head.dtype_bytes;
        (head, added)
    }

    /// KV-cache bytes a token takes in the GPU memory of `n` layers (a
    /// pipeline stage's) over `tp` GPUs: each GPU holds its share of the KV
    /// heads but at least one — vLLM's `ModelConfig.get_num_kv_heads`,
    /// `max(1, total_num_kv_heads // tensor_parallel_size)` — and MLA's
    /// latent whole (one KV head, `get_total_num_kv_heads` is 1 with MLA), so
    /// heads fewer than the GPUs are replicated on them. `n` ×
    /// [`Self::kv_bytes_per_token`] / layers when the heads divide evenly.
    pub fn kv_bytes_per_token_of(&self, n: u64, tp: u64) -> u64 {
        let per_gpu = match self.attention {
            Attention::Gqa { kv_heads, head_dim, .. } => 2 * (kv_heads / tp).max(1) * head_dim,
            Attention::Mla { kv_lora_rank, qk_rope_head_dim, .. } => kv_lora_rank + qk_rope_head_dim,
        };
        n * per_gpu * tp * self.kv_dtype_bytes
    }

    /// Bytes of one routed expert's weights in one layer.
    pub fn expert_bytes(&self) -> f64 {
        let Some(m) = &self.moe else { return 0.0 };
        let q = self.quantization.as_ref().map_or(self.dtype_bytes as f64, |q| q.bytes_per_param);
        self.mlp_params(m.expert_intermediate) as f64 * q
            + if m.expert_bias { ((2 * m.expert_intermediate + self.d()) * self.dtype_bytes) as f64 } else { 0.0 }
    }

    /// Weight bytes a forward pass over `tokens` tokens reads: everything
    /// but the routed experts, plus in each MoE layer the experts those
    /// tokens are expected to touch ([`expected_experts`]). A dense model
    /// reads all of its weights whatever the batch.
    pub fn weight_bytes_read(&self, tokens: f64) -> f64 {
        let all = self.weight_bytes() as f64;
        let Some(m) = &self.moe else { return all };
        all - self.routed_expert_bytes()
            + m.layers as f64 * expected_experts(m.experts, m.active, tokens.max(1.0)) * self.expert_bytes()
    }

    /// Bytes of all the routed experts of every MoE layer (0 for a dense model).
    pub fn routed_expert_bytes(&self) -> f64 {
        self.moe.as_ref().map_or(0.0, |m| (m.layers * m.experts) as f64 * self.expert_bytes())
    }

    /// KV-cache values per token in one layer.
    fn kv_values_per_layer(&self) -> u64 {
        match self.attention {
            Attention::Gqa { kv_heads, head_dim, .. } => 2 * kv_heads * head_dim,
            Attention::Mla { kv_lora_rank, qk_rope_head_dim, .. } => kv_lora_rank + qk_rope_head_dim,
        }
    }

    fn windowed_layers(&self) -> u64 {
        self.window.map_or(0, |(_, n)| n)
    }

    /// KV-cache bytes per token over every layer: what a GPU block of a
    /// sequence holds (`2 × layers × kv_heads × head_dim × bytes`, or for MLA
    /// `layers × (kv_lora_rank + qk_rope_head_dim) × bytes`), and what the
    /// tiers store and transfer.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.num_layers * self.kv_values_per_layer() * self.kv_dtype_bytes
    }

    /// KV-cache bytes per token of the full-attention layers only: what each
    /// token beyond the sliding window costs.
    pub fn kv_bytes_per_token_full(&self) -> u64 {
        (self.num_layers - self.windowed_layers()) * self.kv_values_per_layer() * self.kv_dtype_bytes
    }

    /// The step model's view of this model.
    pub fn shape(&self) -> ModelShape {
        let d = self.d() as f64;
        let d_attn = match self.attention {
            Attention::Gqa { heads, head_dim, .. } => (heads * head_dim) as f64,
            Attention::Mla { heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, .. } => {
                (heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)) as f64 / 2.0
            }
        };
        // Opal's dense term is b·d² per layer and token: b = 24 stands for
        // 2 FLOPs × the ≈ 12 d² weights of a dense layer. Other families
        // count their own active weights per layer against those 12 d².
        let linear_d2 = match &self.moe {
            None if matches!(self.attention, Attention::Gqa { .. }) => self.num_layers as f64 * d * d,
            _ => {
                let attn = self.attention_linear_params() as f64;
                let dense = self.dense_layers() as f64 * (attn + self.mlp_params(self.intermediate_size) as f64);
                let moe = self.moe.as_ref().map_or(0.0, |m| {
                    let per = attn
                        + self.mlp_params(m.shared_intermediate) as f64
                        + (m.active * self.mlp_params(m.expert_intermediate)) as f64;
                    m.layers as f64 * per
                });
                (dense + moe) / 12.0
            }
        };
        let (window, windowed) = self.window.unwrap_or((u64::MAX, 0));
        ModelShape {
            full_layers: (self.num_layers - windowed) as f64,
            windowed_layers: windowed as f64,
            window,
            d_attn,
            linear_d2,
            kv_full_bytes_per_token: self.kv_bytes_per_token_full() as f64,
            kv_window_bytes_per_token: (windowed * self.kv_values_per_layer() * self.kv_dtype_bytes) as f64,
            fp8_weights: self
                .quantization
                .as_ref()
                .is_some_and(|q| q.bytes_per_param <= 1.05 && q.bytes_per_param >= 1.0),
        }
    }
}

/// A worker's GPU memory for one model: vLLM's
/// `memory × tp × gpu_memory_utilization − weights`, in KV blocks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvPool {
    /// Memory vLLM may use, bytes (`memory_gb` GiB × tp × utilisation).
    pub memory_bytes: f64,
    /// Of that, the weights, bytes.
    pub weight_bytes: f64,
    /// Bytes of one KV block (`block_size` tokens).
    pub block_bytes: u64,
    /// Whole blocks left for the KV cache (0 when the weights do not fit).
    pub blocks: u64,
}

impl KvPool {
    /// The pool of `model` on `tp` GPUs of `memory_gb` GiB at `utilization`, in blocks of `block_size` tokens.
    pub fn new(model: &ModelArch, memory_gb: f64, tp: u32, utilization: f64, block_size: u64) -> KvPool {
        let memory_bytes = memory_gb * f64::from(tp) * (1u64 << 30) as f64 * utilization;
        let weight_bytes = model.weight_bytes() as f64;
        let block_bytes = block_size * model.kv_bytes_per_token_of(model.num_layers, u64::from(tp));
        let blocks = if weight_bytes < memory_bytes {
            ((memory_bytes - weight_bytes) / block_bytes as f64).floor() as u64
        } else {
            0
        };
        KvPool { memory_bytes, weight_bytes, block_bytes, blocks }
    }

    /// The pool of a worker whose layers are split over pipeline stages
    /// (`layers[s]` on stage `s`, each on `tp` GPUs): each stage's blocks
    /// from its own memory, weights and layers, and the engine's the fewest
    /// of any stage, as vLLM v1 takes the minimum over its ranks
    /// (`get_kv_cache_configs`, `vllm/v1/core/kv_cache_utils.py`).
    /// `memory_bytes` and `weight_bytes` are then one stage's (the heaviest),
    /// `block_bytes` a block over every layer. One stage is [`Self::new`].
    pub fn staged(
        model: &ModelArch,
        memory_gb: f64,
        tp: u32,
        utilization: f64,
        block_size: u64,
        layers: &[u64],
    ) -> KvPool {
        if layers.len() <= 1 {
            return KvPool::new(model, memory_gb, tp, utilization, block_size);
        }
        let memory_bytes = memory_gb * f64::from(tp) * (1u64 << 30) as f64 * utilization;
        let (mut first, mut blocks, mut heaviest) = (0, u64::MAX, 0u64);
        for &n in layers {
            let weights = model.stage_weight_bytes(first, n, layers.len() as u64);
            heaviest = heaviest.max(weights);
            let stage_block = block_size * model.kv_bytes_per_token_of(n, u64::from(tp));
            let w = weights as f64;
            blocks =
                blocks.min(if w < memory_bytes { ((memory_bytes - w) / stage_block as f64).floor() as u64 } else { 0 });
            first += n;
        }
        KvPool {
            memory_bytes,
            weight_bytes: heaviest as f64,
            block_bytes: block_size * model.kv_bytes_per_token_of(model.num_layers, u64::from(tp)),
            blocks,
        }
    }

    /// The pool with the routed experts where `sharding` puts them (none
    /// moved: the pool as it is, staged or not): with expert parallelism,
    /// the slots of the experts that do not divide evenly over the GPUs
    /// (every GPU holds the busiest one's count); with data-parallel
    /// attention over `dp` ranks, `1/dp` of the experts (and of those
    /// slots) — the other ranks hold the rest.
    pub fn with_experts_over(self, model: &ModelArch, sharding: Sharding) -> KvPool {
        let padding = model.expert_parallel_padding_bytes(u64::from(sharding.ep));
        let dp = f64::from(sharding.dp);
        let shed = if sharding.dp > 1 { model.routed_expert_bytes() * (dp - 1.0) / dp } else { 0.0 };
        if padding == 0 && shed == 0.0 {
            return self;
        }
        let weight_bytes = self.weight_bytes + padding as f64 / dp - shed;
        let blocks = if weight_bytes < self.memory_bytes {
            ((self.memory_bytes - weight_bytes) / self.block_bytes as f64).floor() as u64
        } else {
            0
        };
        KvPool { weight_bytes, blocks, ..self }
    }

    /// The pool with a speculative drafter beside the model: `weights` more
    /// bytes, and `kv_bytes_per_token` more KV per token in every block (vLLM
    /// gives the drafter's layers their KV in the same blocks: one block
    /// table, a page per layer). Without one (both 0), the pool as it is, staged or not.
    pub fn with_drafter(self, weights: u64, kv_bytes_per_token: u64, block_size: u64) -> KvPool {
        if weights == 0 && kv_bytes_per_token == 0 {
            return self;
        }
        let block_bytes = self.block_bytes + block_size * kv_bytes_per_token;
        let weight_bytes = self.weight_bytes + weights as f64;
        let blocks = if weight_bytes < self.memory_bytes {
            ((self.memory_bytes - weight_bytes) / block_bytes as f64).floor() as u64
        } else {
            0
        };
        KvPool { weight_bytes, block_bytes, blocks, ..self }
    }

    /// Whether the weights leave room for any KV cache.
    pub fn fits(&self) -> bool {
        self.weight_bytes < self.memory_bytes
    }

    /// Sequences of `tokens` tokens the pool holds at once (each needs whole blocks).
    pub fn sequences_of(&self, tokens: u64, block_size: u64) -> u64 {
        self.blocks / tokens.div_ceil(block_size).max(1)
    }
}

/// Everything the simulator derives from a model (and, given a GPU, how it
/// fits): what `opal-sweep model` prints.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelReport {
    /// Preset name or config path.
    pub name: String,
    /// `model_type`.
    pub model_type: String,
    /// `dense` or `moe`.
    pub family: String,
    /// `gqa` or `mla`, with `+sliding-window`.
    pub attention: String,
    /// Layers.
    pub layers: u64,
    /// Hidden size.
    pub hidden_size: u64,
    /// Longest sequence, tokens.
    pub max_model_len: u64,
    /// Every parameter.
    pub params: u64,
    /// Parameters a token uses.
    pub active_params: u64,
    /// Weight bytes.
    pub weight_bytes: u64,
    /// Bytes per unquantised weight.
    pub weight_dtype_bytes: u64,
    /// `quant_method` of the quantised weights, if any.
    pub quantization: Option<String>,
    /// KV bytes per token over every layer.
    pub kv_bytes_per_token: u64,
    /// KV bytes per token of the full-attention layers.
    pub kv_bytes_per_token_full: u64,
    /// Bytes per KV element.
    pub kv_dtype_bytes: u64,
    /// Sliding window, tokens.
    pub sliding_window: Option<u64>,
    /// Layers that slide.
    pub windowed_layers: u64,
    /// Routed experts per MoE layer.
    pub experts: Option<u64>,
    /// Experts per token.
    pub experts_per_token: Option<u64>,
    /// MoE layers.
    pub moe_layers: Option<u64>,
    /// How it fits on a worker, when a GPU was given.
    pub fit: Option<FitReport>,
}

/// How a model fits on a worker.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FitReport {
    /// GPU.
    pub gpu: String,
    /// GPUs per pipeline stage.
    pub tp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Decoder layers on each stage (vLLM's split).
    pub stage_layers: Vec<u64>,
    /// Weight bytes on each GPU of each stage.
    pub stage_weight_bytes_per_gpu: Vec<u64>,
    /// Fraction of memory vLLM may use.
    pub gpu_memory_utilization: f64,
    /// Memory vLLM may use on one stage (all of it without stages), bytes.
    pub memory_bytes: f64,
    /// Whether the weights leave room for a KV cache.
    pub fits: bool,
    /// Tokens per block.
    pub block_size: u64,
    /// KV cache bytes.
    pub kv_pool_bytes: f64,
    /// KV blocks.
    pub kv_pool_blocks: u64,
    /// KV tokens.
    pub kv_pool_tokens: u64,
    /// Sequence length the batch figure is for, tokens.
    pub context: u64,
    /// Sequences of `context` tokens the KV cache holds at once.
    pub max_batch_at_context: u64,
}

/// A worker to fit a model on: what `opal-sweep model --gpu` describes.
#[derive(Clone, Copy, Debug)]
pub struct FitInput<'a> {
    /// GPU name.
    pub gpu: &'a str,
    /// Its memory, GiB.
    pub memory_gb: f64,
    /// GPUs per stage.
    pub tp: u32,
    /// Pipeline stages (at most the model's layers).
    pub pp: u32,
    /// Fraction of memory vLLM may use.
    pub utilization: f64,
    /// Tokens per KV block.
    pub block_size: u64,
    /// Sequence length for the batch figure, tokens.
    pub context: u64,
}

impl ModelReport {
    /// The report of `model`, and of its fit on a worker.
    pub fn new(model: &ModelArch, fit: Option<FitInput<'_>>) -> ModelReport {
        let fit = fit.map(|f| {
            let FitInput { gpu, memory_gb, tp, pp, utilization: util, block_size, context } = f;
            let layers = partition(model.num_layers, u64::from(pp));
            let pool = KvPool::staged(model, memory_gb, tp, util, block_size, &layers);
            let mut first = 0;
            let per_gpu = layers
                .iter()
                .map(|&n| {
                    first += n;
                    model.stage_weight_bytes(first - n, n, layers.len() as u64) / u64::from(tp)
                })
                .collect();
            FitReport {
                gpu: gpu.to_string(),
                tp,
                pp,
                stage_layers: layers,
                stage_weight_bytes_per_gpu: per_gpu,
                gpu_memory_utilization: util,
                memory_bytes: pool.memory_bytes,
                fits: pool.fits(),
                block_size,
                kv_pool_bytes: (pool.blocks * pool.block_bytes) as f64,
                kv_pool_blocks: pool.blocks,
                kv_pool_tokens: pool.blocks * block_size,
                context,
                max_batch_at_context: pool.sequences_of(context, block_size),
            }
        });
        ModelReport {
            name: model.name.clone(),
            model_type: model.model_type.clone(),
            family: model.family().to_string(),
            attention: model.attention_kind(),
            layers: model.num_layers,
            hidden_size: model.hidden_size,
            max_model_len: model.max_model_len,
            params: model.parameter_count(),
            active_params: model.active_parameter_count(),
            weight_bytes: model.weight_bytes(),
            weight_dtype_bytes: model.dtype_bytes,
            quantization: model.quantization.as_ref().map(|q| q.method.clone()),
            kv_bytes_per_token: model.kv_bytes_per_token(),
            kv_bytes_per_token_full: model.kv_bytes_per_token_full(),
            kv_dtype_bytes: model.kv_dtype_bytes,
            sliding_window: model.window.map(|(w, _)| w),
            windowed_layers: model.window.map_or(0, |(_, n)| n),
            experts: model.moe.as_ref().map(|m| m.experts),
            experts_per_token: model.moe.as_ref().map(|m| m.active),
            moe_layers: model.moe.as_ref().map(|m| m.layers),
            fit,
        }
    }
}

/// What the roofline needs of a model, flattened to numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelShape {
    /// Full-attention layers.
    pub full_layers: f64,
    /// Sliding-window layers.
    pub windowed_layers: f64,
    /// Their window, tokens (`u64::MAX` without one).
    pub window: u64,
    /// Attention width: heads × head dim (MLA: heads × the mean of the q/k and v head dims).
    pub d_attn: f64,
    /// Σ over layers of the dense term's d² (active weights / 12 beyond dense GQA models).
    pub linear_d2: f64,
    /// KV bytes per token of the full-attention layers.
    pub kv_full_bytes_per_token: f64,
    /// KV bytes per token of the windowed layers.
    pub kv_window_bytes_per_token: f64,
    /// Linear layers run in FP8 (the GPU's FP8 rate applies to them).
    pub fp8_weights: bool,
}

/// `Σ_{i=p+1}^{n} 2·min(i, w)`: causal token pairs (×2, Opal's `n(n+1) − p(p+1)`
/// form) when each token attends to at most `w` tokens.
pub fn attention_pairs(p: u64, n: u64, w: u64) -> f64 {
    let tri = |x: u64| -> f64 {
        // Σ_{i=1}^{x} 2·min(i, w)
        if x <= w { x as f64 * (x as f64 + 1.0) } else { w as f64 * (w as f64 + 1.0) + 2.0 * w as f64 * (x - w) as f64 }
    };
    tri(n) - tri(p)
}

/// The Hugging Face `config.json` reader.
pub mod config;

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(name: &str) -> ModelArch {
        ModelArch::preset(name).unwrap_or_else(|| panic!("no preset {name}"))
    }

    fn within(x: f64, want: f64, tol: f64) -> bool {
        ((x - want) / want).abs() <= tol
    }

    #[test]
    fn llama_3_1_8b_has_8_03_billion_parameters_and_128_kib_kv_per_token() {
        let m = preset("meta-llama/Llama-3.1-8B-Instruct");
        // embed 128256·4096 = 525,336,576, untied ×2 = 1,050,673,152
        // per layer: attn 4096·4096·2 + 4096·1024·2 = 41,943,040; MLP 3·4096·14336 = 176,160,768;
        //            norms 8192 → 218,112,000 × 32 = 6,979,584,000; final norm 4096.
        assert_eq!(m.parameter_count(), 1_050_673_152 + 6_979_584_000 + 4096);
        assert_eq!(m.parameter_count(), 8_030_261_248);
        assert_eq!(m.active_parameter_count(), m.parameter_count(), "dense: every weight is active");
        assert_eq!(m.weight_bytes(), 2 * 8_030_261_248);
        // 2 · 32 layers · 8 kv heads · 128 · 2 bytes = 131,072.
        assert_eq!(m.kv_bytes_per_token(), 131_072);
        assert_eq!((m.family(), m.attention_kind().as_str()), ("dense", "gqa"));
    }

    #[test]
    fn mixtral_8x7b_has_46_7_billion_parameters_of_which_12_9_billion_are_active() {
        let m = preset("mistralai/Mixtral-8x7B-v0.1");
        // d = 4096, 32 layers, 32 heads, 8 KV heads of 128, 8 experts of width 14336, top-2, V = 32000.
        let (d, l, v) = (4096u64, 32u64, 32_000u64);
        let attn = d * d * 2 + d * 1024 * 2; // 41,943,040
        let expert = 3 * d * 14_336; // 176,160,768
        let router = d * 8;
        let layer = attn + 8 * expert + router + 2 * d;
        let total = 2 * v * d + l * layer + d;
        assert_eq!(m.parameter_count(), total);
        assert!(within(total as f64, 46.7e9, 0.005), "{total}");
        let active = total - l * 6 * expert;
        assert_eq!(m.active_parameter_count(), active);
        assert!(within(active as f64, 12.9e9, 0.005), "{active}");
        assert_eq!(m.kv_bytes_per_token(), 131_072, "the same attention as Llama-3.1-8B");
        assert_eq!(m.family(), "moe");
    }

    #[test]
    fn kv_heads_fewer_than_the_gpus_are_replicated_on_them() {
        // Qwen3-30B-A3B: 48 layers, 4 KV heads of 128. Over 4 GPUs one head
        // each: 48 × 2 × 4 × 128 × 2 B = 98,304 B a token in all; over 8 GPUs
        // still one head each (vLLM's max(1, 4 // 8)), twice that.
        let m = preset("Qwen/Qwen3-30B-A3B");
        assert_eq!(m.kv_bytes_per_token(), 98_304);
        assert_eq!(m.kv_bytes_per_token_of(48, 4), 98_304);
        assert_eq!(m.kv_bytes_per_token_of(48, 8), 196_608);
        let pool = |tp| KvPool::new(&m, 80.0, tp, 0.9, 16);
        assert_eq!(pool(8).block_bytes, 16 * 196_608);
        assert_eq!(
            pool(8).blocks,
            ((8.0 * 77_309_411_328.0 - 61_064_245_248.0) / (16.0 * 196_608.0f64)).floor() as u64
        );
    }

    #[test]
    fn deepseek_v3_caches_the_mla_latent_and_has_671_billion_parameters() {
        let m = preset("deepseek-ai/DeepSeek-V3");
        // MLA: 61 layers × (kv_lora_rank 512 + qk_rope_head_dim 64) × 2 bytes = 70,272.
        assert_eq!(m.kv_bytes_per_token(), 61 * (512 + 64) * 2);
        assert_eq!(m.kv_bytes_per_token(), 70_272);
        // Every GPU of a tensor-parallel worker keeps the whole latent (vLLM:
        // one KV head, never split): over 8 GPUs a token takes 8 × 70,272 B.
        assert_eq!(m.kv_bytes_per_token_of(61, 8), 562_176);
        assert_eq!(m.kv_bytes_per_token_of(61, 1), 70_272);
        // d = 7168, 128 heads; q: 7168·1536 + 1536·128·192; kv_a: 7168·(512 + 64); kv_b: 512·128·(128 + 128);
        // o: 128·128·7168; norms of the latents 1536 + 512.
        let d = 7168u64;
        let attn = d * 1536 + 1536 * 128 * 192 + d * 576 + 512 * 128 * 256 + 128 * 128 * d + 1536 + 512;
        let dense_mlp = 3 * d * 18_432; // first_k_dense_replace = 3 layers
        let expert = 3 * d * 2048;
        // 58 MoE layers: 256 routed + 1 shared expert, router 256·d + the score-correction bias 256.
        let moe_mlp = 256 * expert + expert + 256 * d + 256;
        let total = 2 * 129_280 * d + 61 * (attn + 2 * d) + 3 * dense_mlp + 58 * moe_mlp + d;
        assert_eq!(m.parameter_count(), total);
        assert!(within(total as f64, 671e9, 0.005), "{total} (the published 671 B, without the MTP module)");
        let active = total - 58 * (256 - 8) * expert;
        assert_eq!(m.active_parameter_count(), active);
        assert!(within(active as f64, 37.5e9, 0.01), "{active} (published: 37 B)");
        // FP8 blocks of 128 × 128 with one f32 scale each: 1 + 4/16384 bytes per quantised weight.
        let q = 61 * (attn - 1536 - 512) + 3 * dense_mlp + 58 * 257 * expert;
        let bytes = (total - q) * 2 + (q as f64 * (1.0 + 4.0 / 16_384.0)).round() as u64;
        assert_eq!(m.weight_bytes(), bytes);
        assert_eq!(m.attention_kind(), "mla");
    }

    #[test]
    fn sliding_window_layers_are_counted_apart() {
        // Gemma 2 9B: 42 layers, every other one sliding over 4096 tokens; 8 KV heads of 256.
        let m = preset("google/gemma-2-9b-it");
        assert_eq!(m.window, Some((4096, 21)));
        assert_eq!(m.kv_bytes_per_token(), 2 * 42 * 8 * 256 * 2);
        assert_eq!(m.kv_bytes_per_token_full(), 2 * 21 * 8 * 256 * 2);
        // d = 3584, 16 heads of 256, F = 14336, V = 256000 tied, four norms per layer.
        let d = 3584u64;
        let layer = d * 4096 + 2 * d * 2048 + 4096 * d + 3 * d * 14_336 + 4 * d;
        assert_eq!(m.parameter_count(), 256_000 * d + 42 * layer + d);
        assert!(within(m.parameter_count() as f64, 9.24e9, 0.005), "{}", m.parameter_count());
        // gpt-oss-20b: 24 layers alternating sliding (128) and full; 8 KV heads of 64.
        let g = preset("openai/gpt-oss-20b");
        assert_eq!(g.window, Some((128, 12)));
        assert_eq!((g.kv_bytes_per_token(), g.kv_bytes_per_token_full()), (24 * 2 * 8 * 64 * 2, 12 * 2 * 8 * 64 * 2));
    }

    #[test]
    fn gpt_oss_stores_its_experts_in_mxfp4() {
        let m = preset("openai/gpt-oss-20b");
        // d = 2880, 64 heads and 8 KV heads of 64 with biases on all four projections and a sink per head;
        // 32 experts of width 2880 (with biases), top-4; a router with bias; V = 201088 untied.
        let d = 2880u64;
        let attn = d * 4096 + 2 * d * 512 + 4096 * d;
        let attn_other = 4096 + 2 * 512 + d + 64;
        let expert = 3 * d * 2880 + 2 * 2880 + d;
        let layer = attn + attn_other + 32 * expert + d * 32 + 32 + 2 * d;
        let total = 2 * 201_088 * d + 24 * layer + d;
        assert_eq!(m.parameter_count(), total);
        assert!(within(total as f64, 20.9e9, 0.005), "{total}");
        // Expert weights (not their biases) in MXFP4: 4 bits + an 8-bit scale per 32.
        let q = 24 * 32 * 3 * d * 2880;
        assert_eq!(m.weight_bytes(), (total - q) * 2 + (q as f64 * (0.5 + 1.0 / 32.0)).round() as u64);
        assert!(within(m.weight_bytes() as f64, 13.8e9, 0.02), "{} (the checkpoint is 13.8 GB)", m.weight_bytes());
    }

    #[test]
    fn an_fp8_checkpoint_stores_its_linear_weights_in_one_byte() {
        let m = preset("Qwen/Qwen3-32B-FP8");
        // d = 5120, 64 layers, 64 heads and 8 KV heads of 128, F = 25600, V = 151936 untied, q/k norms.
        let d = 5120u64;
        let linear = d * 8192 + 2 * d * 1024 + 8192 * d + 3 * d * 25_600;
        let total = 2 * 151_936 * d + 64 * (linear + 2 * 128 + 2 * d) + d;
        assert_eq!(m.parameter_count(), total);
        assert_eq!(m.parameter_count(), preset("qwen3-32b").parameter_count(), "the same architecture");
        let q = 64 * linear;
        assert_eq!(m.weight_bytes(), (total - q) * 2 + (q as f64 * (1.0 + 4.0 / 16_384.0)).round() as u64);
        assert!(m.shape().fp8_weights);
    }

    #[test]
    fn qwen3_moe_presets_land_on_their_published_sizes() {
        let b = |n: &str| (preset(n).parameter_count() as f64 / 1e9, preset(n).active_parameter_count() as f64 / 1e9);
        let (t, a) = b("qwen3-30b-a3b");
        assert!(within(t, 30.5, 0.005) && within(a, 3.35, 0.02), "{t} {a}");
        let (t, a) = b("qwen3-235b-a22b");
        assert!(within(t, 235.1, 0.005) && within(a, 22.2, 0.02), "{t} {a}");
        let (t, _) = b("llama-3.1-405b");
        assert!(within(t, 405.85, 0.005), "{t}");
    }

    #[test]
    fn every_preset_parses_and_answers_to_its_hugging_face_id() {
        for name in ModelArch::presets() {
            let m = preset(name);
            assert_eq!(m.name, name);
            assert!(m.parameter_count() > 0 && m.kv_bytes_per_token() > 0 && m.weight_bytes() > 0);
        }
        assert_eq!(preset("ibm-granite/granite-3.3-8b-instruct").name, "granite-3.3-8b");
        assert!(ModelArch::preset("gpt-5").is_none());
    }

    #[test]
    fn a_family_that_is_not_modelled_is_refused_by_name() {
        let e = config::parse(r#"{"model_type": "mamba", "hidden_size": 768}"#, "m").unwrap_err();
        assert!(e.contains("`mamba`") && e.contains("state-space") && e.contains("deepseek_v3"), "{e}");
        let e = config::parse(r#"{"model_type": "t5"}"#, "m").unwrap_err();
        assert!(e.contains("`t5`") && e.contains("supported"), "{e}");
    }

    #[test]
    fn the_tensor_parallel_degree_must_divide_the_heads() {
        let m = ModelArch::preset("llama-3.1-8b").unwrap();
        assert_eq!(m.tp_problem(1), None);
        assert_eq!(m.tp_problem(8), None);
        let e = m.tp_problem(3).unwrap();
        assert!(e.contains("32 attention heads") && e.ends_with("1, 2, 4, 8, 16, 32"), "{e}");
    }

    #[test]
    fn kv_heads_must_divide_the_query_heads() {
        let cfg = |kv: u32| {
            format!(
                r#"{{"model_type": "llama", "torch_dtype": "bfloat16", "num_hidden_layers": 2, "hidden_size": 64,
                "num_attention_heads": 32, "num_key_value_heads": {kv}, "vocab_size": 10,
                "max_position_embeddings": 100, "intermediate_size": 128}}"#
            )
        };
        for bad in [0, 3, 64] {
            let e = config::parse(&cfg(bad), "m").unwrap_err();
            assert!(e.contains("`num_key_value_heads`") && e.contains("dividing"), "{bad}: {e}");
        }
        for good in [1, 8, 32] {
            assert!(config::parse(&cfg(good), "m").is_ok(), "{good}");
        }
    }

    #[test]
    fn a_field_the_family_needs_is_required_by_name() {
        let cfg = r#"{"model_type": "mixtral", "torch_dtype": "bfloat16", "num_hidden_layers": 2,
            "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 100,
            "intermediate_size": 128, "num_experts_per_tok": 2}"#;
        let e = config::parse(cfg, "m").unwrap_err();
        assert!(e.contains("`num_local_experts`") && e.contains("mixtral"), "{e}");
    }

    #[test]
    fn experts_touched_by_a_batch_follow_the_occupancy_formula() {
        // One token touches k experts; E·(1 − (1 − k/E)^B) after B tokens, tending to E.
        assert!((expected_experts(8, 2, 1.0) - 2.0).abs() < 1e-12);
        assert!((expected_experts(8, 2, 2.0) - 8.0 * (1.0 - 0.75f64.powi(2))).abs() < 1e-12);
        assert!((expected_experts(8, 2, 1000.0) - 8.0).abs() < 1e-9);
    }

    #[test]
    fn attention_pairs_count_at_most_the_window() {
        assert_eq!(attention_pairs(0, 10, u64::MAX), 110.0);
        assert_eq!(attention_pairs(3, 10, u64::MAX), 110.0 - 12.0);
        // Window 4: 2·(1 + 2 + 3 + 4) + 6·8 = 68; from 5 on each token adds 8.
        assert_eq!(attention_pairs(0, 10, 4), 68.0);
        assert_eq!(attention_pairs(5, 10, 4), 40.0);
    }

    #[test]
    fn layers_split_as_vllm_get_pp_indices_does() {
        // Cases run through vLLM's rule (vllm/distributed/utils.py at 9aaf83ef5).
        assert_eq!(partition(32, 1), [32]);
        assert_eq!(partition(32, 3), [11, 11, 10]);
        assert_eq!(partition(80, 3), [27, 27, 26]);
        assert_eq!(partition(126, 2), [63, 63]);
        assert_eq!(partition(126, 4), [31, 32, 32, 31]);
        assert_eq!(partition(126, 8), [15, 16, 16, 16, 16, 16, 16, 15]);
        assert_eq!(partition(61, 4), [15, 15, 16, 15]);
        assert_eq!(partition(32, 5), [6, 6, 7, 7, 6]);
    }
}
