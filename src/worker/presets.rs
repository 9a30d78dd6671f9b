//! Model architectures and GPUs: presets, Hugging Face `config.json` loading,
//! and the quantities derived from them (parameters, weight bytes, KV bytes
//! per token).
//!
//! Simplification: models are dense decoder-only transformers with grouped
//! query attention and a gated (SwiGLU) MLP — the Llama/Granite/Qwen family.
//! Mixture-of-experts configs are rejected rather than mis-sized.

use serde::Deserialize;
use std::path::Path;

/// The architecture numbers the worker needs from a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArch {
    /// Canonical name (the preset name or the config file's path).
    pub name: String,
    /// Transformer layers (`num_hidden_layers`).
    pub num_layers: u64,
    /// Model width d (`hidden_size`).
    pub hidden_size: u64,
    /// Query heads.
    pub num_attention_heads: u64,
    /// Key/value heads (GQA); equals the query heads for multi-head attention.
    pub num_kv_heads: u64,
    /// Per-head dimension.
    pub head_dim: u64,
    /// MLP width (`intermediate_size`).
    pub intermediate_size: u64,
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Whether the output projection shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether the q/k/v projections have biases (Qwen2).
    pub attention_bias: bool,
    /// Bytes per weight and per KV element (2 for bf16/fp16).
    pub dtype_bytes: u64,
    /// Longest sequence the model accepts (`max_position_embeddings`).
    pub max_model_len: u64,
}

impl ModelArch {
    /// Parameter count of a dense decoder with GQA attention and a gated MLP:
    /// embeddings (`V·d`, twice if untied) + per layer
    /// `d·(H·h) + 2·d·(K·h) + (H·h)·d` attention (+ q/k/v biases) +
    /// `3·d·F` MLP + `2·d` norms, + `d` final norm.
    pub fn parameter_count(&self) -> u64 {
        let d = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let attn = d * q + 2 * d * kv + q * d + if self.attention_bias { q + 2 * kv } else { 0 };
        let mlp = 3 * d * self.intermediate_size;
        let per_layer = attn + mlp + 2 * d;
        let embed = self.vocab_size * d * if self.tie_word_embeddings { 1 } else { 2 };
        embed + self.num_layers * per_layer + d
    }

    /// Bytes of weights held on the GPUs (all tensor-parallel ranks together).
    pub fn weight_bytes(&self) -> u64 {
        self.parameter_count() * self.dtype_bytes
    }

    /// KV-cache bytes per token: `2 (K and V) × layers × kv_heads × head_dim × dtype_bytes`.
    pub fn kv_bytes_per_token(&self) -> u64 {
        2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes
    }

    /// Looks up a preset by name (case-insensitive; Hugging Face ids and the
    /// `-instruct` variants are accepted as aliases).
    pub fn preset(name: &str) -> Option<ModelArch> {
        let key = name.to_ascii_lowercase();
        let key = key.rsplit('/').next().unwrap_or(&key);
        let key = key.strip_suffix("-instruct").unwrap_or(key);
        let p = |canon: &str, l, d, h, k, f, v, tie, bias, max| ModelArch {
            name: canon.to_string(),
            num_layers: l,
            hidden_size: d,
            num_attention_heads: h,
            num_kv_heads: k,
            head_dim: d / h,
            intermediate_size: f,
            vocab_size: v,
            tie_word_embeddings: tie,
            attention_bias: bias,
            dtype_bytes: 2,
            max_model_len: max,
        };
        // Numbers from each model's published config.json.
        Some(match key {
            "llama-3.1-8b" | "meta-llama-3.1-8b" => {
                p("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128_256, false, false, 131_072)
            }
            "llama-3.1-70b" | "meta-llama-3.1-70b" => {
                p("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128_256, false, false, 131_072)
            }
            "granite-3.3-8b" => p("granite-3.3-8b", 40, 4096, 32, 8, 12800, 49_159, true, false, 131_072),
            "qwen2.5-7b" => p("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152_064, false, true, 131_072),
            _ => return None,
        })
    }

    /// Names of all presets (for error messages and `--help`).
    pub const PRESETS: &'static [&'static str] = &["llama-3.1-8b", "llama-3.1-70b", "granite-3.3-8b", "qwen2.5-7b"];

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_config(path: &Path) -> Result<ModelArch, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let cfg: HfConfig = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a usable Hugging Face config.json: {e}", path.display()))?;
        if cfg.num_local_experts.is_some() || cfg.num_experts.is_some() {
            return Err(format!(
                "{} describes a mixture-of-experts model, which this simulator does not size; use a dense model",
                path.display()
            ));
        }
        let dtype_bytes = match cfg.torch_dtype.as_deref().unwrap_or("bfloat16") {
            "bfloat16" | "float16" | "half" => 2,
            "float32" | "float" => 4,
            "float8_e4m3fn" | "float8_e5m2" | "int8" => 1,
            other => return Err(format!("{}: unsupported torch_dtype {other:?}", path.display())),
        };
        let heads = cfg.num_attention_heads;
        if heads == 0 || cfg.hidden_size == 0 || cfg.num_hidden_layers == 0 {
            return Err(format!(
                "{}: hidden_size, num_hidden_layers and num_attention_heads must be positive",
                path.display()
            ));
        }
        Ok(ModelArch {
            name: path.display().to_string(),
            num_layers: cfg.num_hidden_layers,
            hidden_size: cfg.hidden_size,
            num_attention_heads: heads,
            num_kv_heads: cfg.num_key_value_heads.unwrap_or(heads),
            head_dim: cfg.head_dim.unwrap_or(cfg.hidden_size / heads),
            intermediate_size: cfg.intermediate_size,
            vocab_size: cfg.vocab_size,
            tie_word_embeddings: cfg.tie_word_embeddings.unwrap_or(false),
            attention_bias: cfg.attention_bias.unwrap_or(cfg.model_type.as_deref() == Some("qwen2")),
            dtype_bytes,
            max_model_len: cfg.max_position_embeddings.unwrap_or(131_072),
        })
    }
}

/// The subset of a Hugging Face `config.json` that sizes a dense model.
#[derive(Deserialize)]
struct HfConfig {
    num_hidden_layers: u64,
    hidden_size: u64,
    num_attention_heads: u64,
    num_key_value_heads: Option<u64>,
    head_dim: Option<u64>,
    intermediate_size: u64,
    vocab_size: u64,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    torch_dtype: Option<String>,
    max_position_embeddings: Option<u64>,
    model_type: Option<String>,
    num_local_experts: Option<u64>,
    num_experts: Option<u64>,
}

/// A GPU's datasheet numbers used by the step-time models.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    /// Canonical name.
    pub name: String,
    /// Dense bf16 peak, 10¹² FLOP/s.
    pub tflops: f64,
    /// HBM bandwidth, 10¹² bytes/s.
    pub mem_bw_tbps: f64,
    /// HBM capacity, GiB (2³⁰ bytes).
    pub memory_gb: f64,
}

impl GpuSpec {
    /// Looks up a preset by name (case-insensitive).
    pub fn preset(name: &str) -> Option<GpuSpec> {
        let g = |n: &str, tflops, bw, mem| GpuSpec { name: n.to_string(), tflops, mem_bw_tbps: bw, memory_gb: mem };
        // Dense bf16 tensor-core peaks and HBM figures from NVIDIA datasheets
        // (SXM parts). H100 uses the original Opal's defaults (989.5, 3.3, 80).
        Some(match name.to_ascii_uppercase().as_str() {
            "A100" | "A100-80G" | "A100-80GB" => g("A100-80G", 312.0, 2.039, 80.0),
            "H100" | "H100-SXM" | "H100-80G" => g("H100", 989.5, 3.3, 80.0),
            "H200" | "H200-SXM" => g("H200", 989.5, 4.8, 141.0),
            "B200" => g("B200", 2250.0, 8.0, 180.0),
            _ => return None,
        })
    }

    /// Names of all presets.
    pub const PRESETS: &'static [&'static str] = &["A100-80G", "H100", "H200", "B200"];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_3_1_8b_has_8_03_billion_parameters_and_128_kib_kv_per_token() {
        let m = ModelArch::preset("meta-llama/Llama-3.1-8B-Instruct").unwrap();
        // embed 128256·4096 = 525,336,576, untied ×2 = 1,050,673,152
        // per layer: attn 4096·4096·2 + 4096·1024·2 = 41,943,040; MLP 3·4096·14336 = 176,160,768;
        //            norms 8192 → 218,112,000 × 32 = 6,979,584,000; final norm 4096.
        assert_eq!(m.parameter_count(), 1_050_673_152 + 6_979_584_000 + 4096);
        assert_eq!(m.weight_bytes(), 2 * 8_030_261_248);
        // 2 · 32 layers · 8 kv heads · 128 · 2 bytes = 131,072.
        assert_eq!(m.kv_bytes_per_token(), 131_072);
    }

    #[test]
    fn presets_land_on_their_published_sizes() {
        let billions = |n: &str| ModelArch::preset(n).unwrap().parameter_count() as f64 / 1e9;
        assert!((billions("llama-3.1-70b") - 70.55).abs() < 0.05, "{}", billions("llama-3.1-70b"));
        assert!((billions("granite-3.3-8b-instruct") - 8.17).abs() < 0.05, "{}", billions("granite-3.3-8b"));
        assert!((billions("Qwen/Qwen2.5-7B") - 7.62).abs() < 0.05, "{}", billions("qwen2.5-7b"));
        assert!(ModelArch::preset("gpt-5").is_none());
    }

    #[test]
    fn hf_config_json_gives_the_same_numbers_as_the_preset() {
        let dir = std::env::temp_dir().join(format!("opal-hf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":4096,
               "intermediate_size":14336,"num_attention_heads":32,"num_hidden_layers":32,
               "num_key_value_heads":8,"vocab_size":128256,"tie_word_embeddings":false,
               "torch_dtype":"bfloat16","max_position_embeddings":131072,"rope_theta":500000.0}"#,
        )
        .unwrap();
        let m = ModelArch::from_hf_config(&path).unwrap();
        let p = ModelArch::preset("llama-3.1-8b").unwrap();
        assert_eq!(m.parameter_count(), p.parameter_count());
        assert_eq!(m.kv_bytes_per_token(), p.kv_bytes_per_token());
        std::fs::write(&path, r#"{"hidden_size":4096,"intermediate_size":1,"num_attention_heads":32,"num_hidden_layers":32,"vocab_size":1,"num_local_experts":8}"#).unwrap();
        assert!(ModelArch::from_hf_config(&path).unwrap_err().contains("mixture-of-experts"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gpu_presets_are_case_insensitive() {
        assert_eq!(GpuSpec::preset("h100").unwrap().tflops, 989.5);
        assert_eq!(GpuSpec::preset("a100").unwrap().name, "A100-80G");
        assert!(GpuSpec::preset("TPUv5").is_none());
    }
}
