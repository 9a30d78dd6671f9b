//! Reading a Hugging Face `config.json` into a [`ModelArch`], family by
//! family. Field names, and the defaults of fields the Hugging Face classes
//! make optional, follow `transformers`' configuration classes
//! (`LlamaConfig`, `Qwen3MoeConfig`, `DeepseekV3Config`, `GptOssConfig`, …);
//! the layer rules (which layers are MoE, which are windowed) follow their
//! modelling code.

use super::{Attention, ModelArch, Moe, Quantization};
use serde_json::{Map, Value};

/// Dense families (`model_type`).
const DENSE: [&str; 8] = ["llama", "mistral", "granite", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3"];
/// Mixture-of-experts families.
const MOE: [&str; 8] =
    ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4_text", "llama4"];
/// State-space and hybrid families, refused by name.
const SSM: [&str; 12] = [
    "mamba",
    "mamba2",
    "falcon_mamba",
    "jamba",
    "zamba",
    "zamba2",
    "bamba",
    "granitemoehybrid",
    "nemotron_h",
    "falcon_h1",
    "recurrent_gemma",
    "rwkv",
];

/// The families that are modelled, for messages.
pub fn supported() -> String {
    format!("dense: {}; mixture of experts: {}", DENSE.join(", "), MOE.join(", "))
}

/// One section of the file (the whole file, or its `text_config`), with the
/// family it belongs to, for error messages.
struct Section<'a> {
    map: &'a Map<String, Value>,
    family: &'a str,
}

impl Section<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str) -> String {
        format!("it lacks `{key}`, which a {} model needs", self.family)
    }

    fn wrong(&self, key: &str, what: &str) -> String {
        format!("`{key}` must be {what}")
    }

    fn u64(&self, key: &str) -> Result<u64, String> {
        self.opt_u64(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>, String> {
        self.get(key).map(|v| v.as_u64().ok_or_else(|| self.wrong(key, "a non-negative integer"))).transpose()
    }

    fn positive(&self, key: &str) -> Result<u64, String> {
        match self.u64(key)? {
            0 => Err(self.wrong(key, "positive")),
            n => Ok(n),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, String> {
        self.get(key).map(|v| v.as_bool().ok_or_else(|| self.wrong(key, "true or false"))).transpose()
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>, String> {
        self.get(key).map(|v| v.as_str().ok_or_else(|| self.wrong(key, "a string"))).transpose()
    }

    fn list(&self, key: &str) -> Option<&Vec<Value>> {
        self.get(key).and_then(Value::as_array)
    }
}

/// Bytes of a weight dtype name.
fn dtype_bytes(name: &str) -> Option<u64> {
    Some(match name {
        "bfloat16" | "float16" | "half" | "bf16" | "fp16" => 2,
        "float32" | "float" | "fp32" => 4,
        "float8_e4m3fn" | "float8_e5m2" | "int8" | "fp8" => 1,
        _ => return None,
    })
}

/// Parses the text of a `config.json` called `name`.
pub fn parse(text: &str, name: &str) -> Result<ModelArch, String> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let top = json.as_object().ok_or("a config.json is a JSON object")?;
    let model_type = top.get("model_type").and_then(Value::as_str).ok_or("it has no `model_type`")?;
    if SSM.contains(&model_type) {
        return Err(format!(
            "model_type `{model_type}` is a state-space or hybrid (Mamba-style) model, which this simulator does not model; supported families: {}",
            supported()
        ));
    }
    if !DENSE.contains(&model_type) && !MOE.contains(&model_type) {
        return Err(format!(
            "model_type `{model_type}` is not a family this simulator models; supported: {}",
            supported()
        ));
    }
    // Multimodal wrappers (Gemma 3, Llama 4) keep the language model in `text_config`.
    let (map, family) = match top.get("text_config").and_then(Value::as_object) {
        Some(t) => (t, t.get("model_type").and_then(Value::as_str).unwrap_or(model_type)),
        None => (top, model_type),
    };
    let s = Section { map, family };
    let dtype = s
        .get("dtype")
        .or_else(|| s.get("torch_dtype"))
        .or_else(|| top.get("dtype").or_else(|| top.get("torch_dtype")).filter(|v| !v.is_null()));
    let dtype = match dtype {
        Some(v) => v.as_str().ok_or_else(|| s.wrong("torch_dtype", "a string"))?,
        // gpt-oss's config.json names no dtype: its weights are BF16 but for
        // the MXFP4 experts (its quantization_config; model card).
        None if family == "gpt_oss" => "bfloat16",
        None => return Err(format!("it lacks `torch_dtype` (or `dtype`), which a {family} model needs")),
    };
    let dtype_bytes = dtype_bytes(dtype).ok_or_else(|| format!("unsupported weight dtype `{dtype}`"))?;

    let layers = s.positive("num_hidden_layers")?;
    let d = s.positive("hidden_size")?;
    let heads = s.positive("num_attention_heads")?;
    let qwen2 = matches!(family, "qwen2" | "qwen2_moe");
    let gemma = matches!(family, "gemma2" | "gemma3_text" | "gemma3");
    let attention = match family {
        "deepseek_v2" | "deepseek_v3" => Attention::Mla {
            heads,
            q_lora_rank: s.opt_u64("q_lora_rank")?,
            kv_lora_rank: s.positive("kv_lora_rank")?,
            qk_nope_head_dim: s.u64("qk_nope_head_dim")?,
            qk_rope_head_dim: s.positive("qk_rope_head_dim")?,
            v_head_dim: s.positive("v_head_dim")?,
        },
        _ => {
            let bias = s.opt_bool("attention_bias")?.unwrap_or(false);
            let kv_heads = s.opt_u64("num_key_value_heads")?.unwrap_or(heads);
            // vLLM's attention layer asserts num_heads % num_kv_heads == 0
            // (each KV head serves a whole group of query heads).
            if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
                return Err(format!(
                    "`num_key_value_heads` = {kv_heads} cannot serve `num_attention_heads` = {heads}: grouped-query attention needs at least 1 and at most {heads} KV heads, dividing the query heads (e.g. 1, 2, 4, 8 for 32)"
                ));
            }
            Attention::Gqa {
                heads,
                kv_heads,
                head_dim: s.opt_u64("head_dim")?.unwrap_or(d / heads),
                // Qwen2 has q/k/v biases and none on the output (fixed in its code).
                qkv_bias: qwen2 || bias,
                o_bias: !qwen2 && bias,
                qk_norm: matches!(family, "qwen3" | "qwen3_moe" | "gemma3_text" | "gemma3"),
                sinks: family == "gpt_oss",
            }
        }
    };
    let moe = moe(&s, family, layers)?;
    // Dense layers' MLP width (a MoE model with no dense layer may omit it).
    let intermediate = match (&moe, family) {
        (_, "llama4_text" | "llama4") => s.u64("intermediate_size_mlp")?,
        (Some(m), _) if m.layers == layers => s.opt_u64("intermediate_size")?.unwrap_or(0),
        _ => s.positive("intermediate_size")?,
    };
    let tie = s.opt_bool("tie_word_embeddings")?.or_else(|| top.get("tie_word_embeddings").and_then(Value::as_bool));
    let arch = ModelArch {
        name: name.to_string(),
        model_type: family.to_string(),
        num_layers: layers,
        hidden_size: d,
        vocab_size: s.positive("vocab_size")?,
        // Gemma ties its embeddings unless told otherwise; the others do not.
        tie_word_embeddings: tie.unwrap_or(gemma),
        norms_per_layer: if gemma { 4 } else { 2 },
        attention,
        window: window(&s, family, layers)?,
        intermediate_size: intermediate,
        quantization: quantization(top, moe.is_some())?,
        moe,
        dtype_bytes,
        kv_dtype_bytes: dtype_bytes,
        max_model_len: s.positive("max_position_embeddings")?,
    };
    Ok(arch)
}

/// The routed experts, per family.
fn moe(s: &Section<'_>, family: &str, layers: u64) -> Result<Option<Moe>, String> {
    let none = Moe {
        layers,
        experts: 0,
        active: 0,
        expert_intermediate: 0,
        shared_intermediate: 0,
        shared_gate: false,
        router_bias: false,
        expert_bias: false,
    };
    let m = match family {
        "mixtral" => Moe {
            experts: s.positive("num_local_experts")?,
            active: s.positive("num_experts_per_tok")?,
            expert_intermediate: s.positive("intermediate_size")?,
            ..none
        },
        "gpt_oss" => Moe {
            experts: s.positive("num_local_experts")?,
            active: match s.opt_u64("num_experts_per_tok")? {
                Some(k) => k,
                None => s.positive("experts_per_token")?,
            },
            expert_intermediate: s.positive("intermediate_size")?,
            router_bias: true,
            expert_bias: true,
            ..none
        },
        "qwen2_moe" | "qwen3_moe" => {
            // Layer i is MoE unless listed in mlp_only_layers, when (i + 1) % decoder_sparse_step == 0.
            let step = s.opt_u64("decoder_sparse_step")?.unwrap_or(1).max(1);
            let dense: Vec<u64> =
                s.list("mlp_only_layers").map(|l| l.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
            let moe_layers = (0..layers).filter(|i| !dense.contains(i) && (i + 1) % step == 0).count() as u64;
            Moe {
                layers: moe_layers,
                experts: s.positive("num_experts")?,
                active: s.positive("num_experts_per_tok")?,
                expert_intermediate: s.positive("moe_intermediate_size")?,
                shared_intermediate: if family == "qwen2_moe" { s.u64("shared_expert_intermediate_size")? } else { 0 },
                shared_gate: family == "qwen2_moe",
                ..none
            }
        }
        "deepseek_v2" | "deepseek_v3" => {
            // Layer i is MoE when i ≥ first_k_dense_replace and i % moe_layer_freq == 0.
            let first = s.u64("first_k_dense_replace")?;
            let freq = s.opt_u64("moe_layer_freq")?.unwrap_or(1).max(1);
            let expert = s.positive("moe_intermediate_size")?;
            Moe {
                layers: (0..layers).filter(|&i| i >= first && i % freq == 0).count() as u64,
                experts: s.positive("n_routed_experts")?,
                active: s.positive("num_experts_per_tok")?,
                expert_intermediate: expert,
                shared_intermediate: s.u64("n_shared_experts")? * expert,
                // V3 adds a score-correction bias to the router (`topk_method = noaux_tc`).
                router_bias: s.opt_str("topk_method")? == Some("noaux_tc"),
                ..none
            }
        }
        "llama4_text" | "llama4" => {
            // MoE layers: every interleave_moe_layer_step-th, each with one shared expert.
            let step = s.positive("interleave_moe_layer_step")?;
            let expert = s.positive("intermediate_size")?;
            Moe {
                layers: (0..layers).filter(|i| (i + 1) % step == 0).count() as u64,
                experts: s.positive("num_local_experts")?,
                active: s.positive("num_experts_per_tok")?,
                expert_intermediate: expert,
                shared_intermediate: expert,
                ..none
            }
        }
        _ => return Ok(None),
    };
    if m.active > m.experts {
        return Err(format!("{} experts per token of {} experts", m.active, m.experts));
    }
    Ok(Some(m))
}

/// `(window, windowed layers)`, per family.
fn window(s: &Section<'_>, family: &str, layers: u64) -> Result<Option<(u64, u64)>, String> {
    // Newer configs list every layer's type.
    let windowed = if let Some(types) = s.list("layer_types") {
        if types.len() as u64 != layers {
            return Err(format!("`layer_types` lists {} layers, num_hidden_layers is {layers}", types.len()));
        }
        types.iter().filter(|t| matches!(t.as_str(), Some("sliding_attention" | "chunked_attention"))).count() as u64
    } else {
        match family {
            // Gemma 2: even layers slide (`is_sliding = not bool(layer_idx % 2)`).
            "gemma2" => layers.div_ceil(2),
            // Gemma 3: every `sliding_window_pattern`-th layer is global.
            "gemma3_text" | "gemma3" => {
                let p = s.opt_u64("sliding_window_pattern")?.unwrap_or(6).max(1);
                layers - layers / p
            }
            // Mistral and Mixtral with a window (not null) slide on every layer.
            "mistral" | "mixtral" if s.get("sliding_window").is_some() => layers,
            // Qwen2/3 only with use_sliding_window, from max_window_layers on.
            "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" if s.opt_bool("use_sliding_window")?.unwrap_or(false) => {
                layers.saturating_sub(s.opt_u64("max_window_layers")?.unwrap_or(layers))
            }
            // Llama 4: chunked attention on the layers that use RoPE
            // (no_rope_layers[i] = 1); an empty list means every
            // no_rope_layer_interval-th layer (4) is global (Llama4TextConfig).
            "llama4_text" | "llama4" => match s.list("no_rope_layers").filter(|l| !l.is_empty()) {
                Some(l) => l.iter().filter(|v| v.as_u64() == Some(1)).count() as u64,
                None => layers - layers / s.opt_u64("no_rope_layer_interval")?.unwrap_or(4).max(1),
            },
            _ => 0,
        }
    };
    if windowed == 0 {
        return Ok(None);
    }
    let key = if family.starts_with("llama4") { "attention_chunk_size" } else { "sliding_window" };
    Ok(Some((s.positive(key)?, windowed)))
}

/// The weight quantisation a `quantization_config` describes.
fn quantization(top: &Map<String, Value>, moe: bool) -> Result<Option<Quantization>, String> {
    let Some(q) = top.get("quantization_config").and_then(Value::as_object) else { return Ok(None) };
    let method = q.get("quant_method").and_then(Value::as_str).ok_or("`quantization_config` has no `quant_method`")?;
    let kept: Vec<&str> = ["modules_to_not_convert", "ignored_layers", "ignore"]
        .iter()
        .filter_map(|k| q.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let attention = !kept.iter().any(|m| m.contains("attn"));
    // `model.layers.N.mlp` entries keep one layer's MLP unquantised.
    let mlp_layers_kept = kept.iter().filter(|m| m.contains("layers.") && m.ends_with("mlp")).count() as u64;
    let int_bits = |bits: f64, group: f64| bits / 8.0 + (2.0 + bits / 8.0) / group;
    let mut block_scaled = false;
    let (bytes, attention, dense_mlp) = match method {
        // FP8 with one f32 scale per weight block (DeepSeek-V3, Qwen3-FP8), or per channel.
        "fp8" | "fbgemm_fp8" => {
            let block = q
                .get("weight_block_size")
                .and_then(Value::as_array)
                .map(|b| b.iter().filter_map(Value::as_u64).product::<u64>());
            block_scaled = block.is_some();
            (1.0 + block.map_or(0.0, |n| 4.0 / n as f64), attention, true)
        }
        // MXFP4 (gpt-oss): 4-bit values and one 8-bit scale per 32.
        "mxfp4" => (0.5 + 1.0 / 32.0, attention, !moe),
        // Integer weights with an f16 scale and a zero point per group.
        "awq" | "gptq" => {
            let bits = ["bits", "w_bit"]
                .iter()
                .find_map(|k| q.get(*k).and_then(Value::as_f64))
                .ok_or("an awq/gptq config without `bits`")?;
            let group =
                ["group_size", "q_group_size"].iter().find_map(|k| q.get(*k).and_then(Value::as_f64)).unwrap_or(128.0);
            (int_bits(bits, group), attention, true)
        }
        "compressed-tensors" => {
            let weights = q
                .get("config_groups")
                .and_then(Value::as_object)
                .and_then(|g| g.values().next())
                .and_then(|g| g.get("weights"))
                .ok_or("a compressed-tensors config without `config_groups.*.weights`")?;
            let bits = weights
                .get("num_bits")
                .and_then(Value::as_f64)
                .ok_or("compressed-tensors weights without `num_bits`")?;
            let float = weights.get("type").and_then(Value::as_str) == Some("float");
            let group = weights.get("group_size").and_then(Value::as_f64);
            let bytes = if float { bits / 8.0 } else { group.map_or(bits / 8.0, |g| int_bits(bits, g)) };
            (bytes, attention, true)
        }
        other => {
            return Err(format!(
                "unsupported quantization `{other}` (fp8, fbgemm_fp8, mxfp4, awq, gptq and compressed-tensors are)"
            ));
        }
    };
    Ok(Some(Quantization {
        method: method.to_string(),
        bytes_per_param: bytes,
        attention,
        dense_mlp,
        mlp_layers_kept,
        block_scaled,
    }))
}
