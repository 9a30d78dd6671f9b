#!/usr/bin/env python3
"""Reference MoE step latencies from NVIDIA aiconfigurator (vLLM backend).

Run with a scratch venv that has aiconfigurator-core 0.12.0 installed
(python3 -m venv /tmp/aic-venv && /tmp/aic-venv/bin/pip install aiconfigurator==0.12.0):

    /tmp/aic-venv/bin/python measurements/aiconfigurator/moe_reference.py --out DIR

Same method as the dense fixtures in this directory:
  prefill row (batch 1, N tokens) = sum of EngineHandle.compile(...)
      .run_static_per_op(batch_size=1, isl=N, osl=1) context ops
      (checked equal to run_static(..., mode="static") TTFT; no serving corrections);
  decode row (B sequences, C cached tokens) = sum of decode_step_per_op(B, C, 1)
      (checked equal to run_static(batch_size=B, isl=C, osl=2, mode="static_gen") TPOT).

It also reproduces two rows of the dense Llama-3.1-8B TP1 fixture first, as a
check that the installed engine is the one the dense fixtures came from, and
writes per-operator breakdowns (breakdown.txt) for the README.

No network access is needed: Qwen3-30B-A3B and DeepSeek-V3 configs are the
copies packaged with aiconfigurator-core; Mixtral-8x7B-v0.1 is packaged but not
in aiconfigurator's DefaultHFModels list (it would try to download it), so it is
passed as a local directory holding the simulator's config.json. The script
asserts that every config aiconfigurator uses is identical to the simulator's
models/*.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path

logging.disable(logging.WARNING)  # silences the "low-fidelity fallback rows" notices

from aiconfigurator_core.sdk.engine import EngineHandle  # noqa: E402
from aiconfigurator_core.sdk.utils import get_model_config_from_model_path  # noqa: E402
import aiconfigurator_core  # noqa: E402

SIM_MODELS = Path(__file__).resolve().parents[2] / "models"
PKG_CONFIGS = Path(aiconfigurator_core.__file__).parent / "model_configs"
LOCAL_MODELS = Path("/tmp/aic-moe-models")

PREFILL_TOKENS = [512, 2048, 8192]
DECODE_BATCHES = [1, 8, 32, 128]
DECODE_CONTEXTS = [1024, 4096]
BACKEND_VERSION = "0.24.0"

BF16 = dict(
    gemm_quant_mode="bfloat16",
    moe_quant_mode="bfloat16",
    kvcache_quant_mode="bfloat16",
    fmha_quant_mode="bfloat16",
)
FP8_BLOCK = dict(
    gemm_quant_mode="fp8_block",
    moe_quant_mode="fp8_block",
    kvcache_quant_mode="bfloat16",
    fmha_quant_mode="bfloat16",
)


def model_path(hf_id: str, sim_name: str) -> str:
    """Return the model path to hand aiconfigurator; assert its config == the simulator's."""
    sim_cfg = json.loads((SIM_MODELS / f"{sim_name}.json").read_text())
    pkg_file = PKG_CONFIGS / f"{hf_id.replace('/', '--')}_config.json"
    pkg_cfg = json.loads(pkg_file.read_text())
    assert pkg_cfg == sim_cfg, f"{pkg_file} differs from {SIM_MODELS / (sim_name + '.json')}"
    from aiconfigurator_core.sdk.utils import DefaultHFModels

    if hf_id in DefaultHFModels:
        return hf_id
    d = LOCAL_MODELS / hf_id.split("/")[-1]
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SIM_MODELS / f"{sim_name}.json", d / "config.json")
    return str(d)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def rows_for(engine: EngineHandle):
    out = []
    for n in PREFILL_TOKENS:
        ctx, _gen = engine.run_static_per_op(batch_size=1, isl=n, osl=1)
        v = sum(x[1] for x in ctx)
        ttft = engine.run_static(batch_size=1, isl=n, osl=1, mode="static")[0]
        assert close(v, ttft), (n, v, ttft)
        out.append(("prefill", 1, n, v))
    for c in DECODE_CONTEXTS:
        for b in DECODE_BATCHES:
            ops = engine.decode_step_per_op(b, c, 1)
            v = sum(x[1] for x in ops)
            tpot = engine.run_static(batch_size=b, isl=c, osl=2, mode="static_gen")[1]
            assert close(v, tpot), (b, c, v, tpot)
            out.append(("decode", b, c, v))
    return out


COMMON_METHOD = """\
# Produced with aiconfigurator-core {core} (PyPI; Apache-2.0), SILICON mode (default database
# mode), in a scratch environment, by measurements/aiconfigurator/moe_reference.py: prefill rows are
# EngineHandle.compile(...).run_static_per_op(batch_size=1, isl=N, osl=1) (equal to
# run_static(..., "static") TTFT, no serving corrections); decode rows are
# decode_step_per_op(B, C, 1): one step of B sequences with C cached tokens (equal to
# run_static(isl=C, osl=2, mode="static_gen") TPOT).
"""

JOBS = [
    dict(
        file="qwen3-30b-a3b-h100-tp1.csv",
        hf="Qwen/Qwen3-30B-A3B",
        sim="qwen3-30b-a3b",
        system="h100_sxm",
        par=dict(tp_size=1, attention_dp_size=1, moe_tp_size=1, moe_ep_size=1),
        quant=BF16,
        tp=1,
        title="Qwen3-30B-A3B at TP1 on H100 SXM, vLLM 0.24.0 kernel\n# tables, BF16 weights and KV cache",
        notes="""\
# Call: EngineHandle.compile("Qwen/Qwen3-30B-A3B", "h100_sxm", "vllm", backend_version="0.24.0",
#   tp_size=1, attention_dp_size=1, moe_tp_size=1, moe_ep_size=1, gemm_quant_mode="bfloat16",
#   moe_quant_mode="bfloat16", kvcache_quant_mode="bfloat16", fmha_quant_mode="bfloat16").
# Model config: aiconfigurator's packaged Qwen--Qwen3-30B-A3B_config.json, byte-for-byte the
# simulator's models/qwen3-30b-a3b.json (48 layers, hidden 2048, 128 experts, top-8, expert
# inter 768, 32 q / 4 kv heads, head_dim 128). MoE priced from moe/vllm/0.24.0/moe_perf.parquet,
# rows bfloat16 / power_law_1.2 (aiconfigurator's default routing skew for this model family) /
# moe_tp 1 / moe_ep 1, kernel vllm_unquantizedfusedmoe_triton_tritonexperts. No communication ops
# at TP1. aiconfigurator's prefill op list has no LM-head (logits) GEMM; decode has one.
""",
    ),
    dict(
        file="qwen3-30b-a3b-h100-tp2.csv",
        hf="Qwen/Qwen3-30B-A3B",
        sim="qwen3-30b-a3b",
        system="h100_sxm",
        par=dict(tp_size=2, attention_dp_size=1, moe_tp_size=2, moe_ep_size=1),
        quant=BF16,
        tp=2,
        title="Qwen3-30B-A3B at TP2 on H100 SXM, vLLM 0.24.0 kernel\n# tables, BF16 weights and KV cache",
        notes="""\
# Call: EngineHandle.compile("Qwen/Qwen3-30B-A3B", "h100_sxm", "vllm", backend_version="0.24.0",
#   tp_size=2, attention_dp_size=1, moe_tp_size=2, moe_ep_size=1, gemm_quant_mode="bfloat16",
#   moe_quant_mode="bfloat16", kvcache_quant_mode="bfloat16", fmha_quant_mode="bfloat16")
#   (vLLM's default: experts tensor-parallel, no --enable-expert-parallel).
# Model config identical to the simulator's models/qwen3-30b-a3b.json. MoE rows bfloat16 /
# power_law_1.2 / moe_tp 2 / moe_ep 1 (the full expert inter 768 is the table key; each GPU
# holds 384). Communication: per layer two custom all-reduces of tokens x hidden in fp16
# (moe_pre_dispatch = the attention-output all-reduce, moe_post_dispatch = the MoE-output
# all-reduce), plus one for the embedding; from comm/vllm/0.24.0 custom_allreduce_perf.
""",
    ),
    dict(
        file="mixtral-8x7b-h100-tp2.csv",
        hf="mistralai/Mixtral-8x7B-v0.1",
        sim="mixtral-8x7b",
        system="h100_sxm",
        par=dict(tp_size=2, attention_dp_size=1, moe_tp_size=2, moe_ep_size=1),
        quant=BF16,
        tp=2,
        title="Mixtral-8x7B at TP2 on H100 SXM, vLLM 0.24.0 kernel\n# tables, BF16 weights and KV cache",
        notes="""\
# Call: EngineHandle.compile("/tmp/aic-moe-models/Mixtral-8x7B-v0.1", "h100_sxm", "vllm",
#   backend_version="0.24.0", tp_size=2, attention_dp_size=1, moe_tp_size=2, moe_ep_size=1,
#   gemm_quant_mode="bfloat16", moe_quant_mode="bfloat16", kvcache_quant_mode="bfloat16",
#   fmha_quant_mode="bfloat16"). The model is passed as a local directory holding the
# simulator's models/mixtral-8x7b.json as config.json (identical to aiconfigurator's packaged
# mistralai--Mixtral-8x7B-v0.1_config.json, which is not in its offline model list): 32 layers,
# hidden 4096, 8 experts, top-2, expert inter 14336, 32 q / 8 kv heads. MoE rows bfloat16 /
# power_law_1.2 / moe_tp 2 / moe_ep 1. Communication: two custom all-reduces per layer (attention
# output, MoE output) plus the embedding's. Prefill op list has no LM-head GEMM; decode has one.
""",
    ),
    dict(
        file="deepseek-v3-h200-ep8.csv",
        hf="deepseek-ai/DeepSeek-V3",
        sim="deepseek-v3",
        system="h200_sxm",
        par=dict(tp_size=8, attention_dp_size=1, moe_tp_size=1, moe_ep_size=8),
        quant=FP8_BLOCK,
        tp=8,
        title="DeepSeek-V3 on 8 x H200 SXM, attention TP8 + experts EP8\n# (vLLM --tensor-parallel-size 8 --enable-expert-parallel), vLLM 0.24.0 kernel tables, FP8\n# block-scaled weights (the checkpoint's own format), BF16 KV cache",
        notes="""\
# Call: EngineHandle.compile("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", backend_version="0.24.0",
#   tp_size=8, attention_dp_size=1, moe_tp_size=1, moe_ep_size=8, gemm_quant_mode="fp8_block",
#   moe_quant_mode="fp8_block", kvcache_quant_mode="bfloat16", fmha_quant_mode="bfloat16"), nextn=0
#   (no MTP). Deviation from the other files: FP8 (block 128x128) weights, as the model ships.
# Model config: packaged deepseek-ai--DeepSeek-V3_config.json, identical to the simulator's
# models/deepseek-v3.json (61 layers, first 3 dense, hidden 7168, 256 routed + 1 shared expert,
# top-8, expert inter 2048, MLA kv_lora 512 / q_lora 1536, 128 heads -> 16 per GPU).
# Architecture difference: aiconfigurator 0.12.0's DeepSeek model ignores first_k_dense_replace
# and prices all 61 layers as MoE layers (routed + shared experts); the real model has 3 dense
# layers (FFN inter 18432) and 58 MoE layers.
# Attention is aiconfigurator's whole-module MLA tables (mla/vllm/0.24.0, DeepSeek-V3 shape,
# 16 heads/GPU); MoE rows fp8_block / power_law_1.01 (DeepSeek's default skew) / moe_tp 1 /
# moe_ep 8, per-rank time of the most loaded rank, all tokens on every rank. EP communication
# in aiconfigurator's vLLM path with TP attention is not an all-to-all: it is a custom
# all-reduce before and after the experts (moe_pre/post_dispatch) plus the attention TP
# all-reduce; DeepEP (moe_comm_backend) is not enabled by compile_engine. Decode shares the
# routed-expert time with the shared expert as one "moe_overlap" op (max of the two).
# Caveat, kept as aiconfigurator composes it: its vLLM DeepSeek path adds *_tp_allreduce
# (2 per layer, 122 all-reduces of tokens x 7168) on top of the pre/post-dispatch all-reduces
# (1 + 1 per layer, 61 + 61), i.e. 4 all-reduces per layer where vLLM with TP attention
# does 2; at prefill 2048 the dispatch pair is 17.8 ms of the 139.2 ms (the mirror's later Rust
# engine drops the pre-dispatch one when the attention all-reduce is priced).
""",
    ),
]


def header(job, core_version):
    return (
        f"# aiconfigurator's own step latencies for {job['title']}: not measurements of whole steps,\n"
        "# but NVIDIA's per-operator measurements composed by its engine (reference step latencies\n"
        "# for MoE validation, made like the dense fixtures in measurements/aiconfigurator/).\n"
        + COMMON_METHOD.format(core=core_version)
        + job["notes"]
    )


def breakdown(engine, label, fh):
    ctx, _ = engine._run_static_per_op_with_metadata(batch_size=1, isl=2048, osl=1)
    dec = engine._decode_step_per_op_with_metadata(32, 1024, 1)
    for name, ops in [("prefill batch 1 x 2048 tokens", ctx), ("decode batch 32, context 1024", dec)]:
        tot = sum(x[1] for x in ops)
        fh.write(f"{label}: {name}: total {tot:.6f} ms\n")
        for x in ops:
            fh.write(f"  {x[0]:<32s} {x[1]:10.6f} ms  {100 * x[1] / tot:5.1f}%  source={x[3]}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--skip-deepseek", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    core_version = metadata.version("aiconfigurator-core")

    # 1. The dense reference still reproduces (llama-3.1-8b-h100-tp1.csv rows).
    llama = EngineHandle.compile(
        "meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "vllm", backend_version=BACKEND_VERSION, tp_size=1, **{
            k: v for k, v in BF16.items() if k != "moe_quant_mode"})
    p512 = llama.run_static(batch_size=1, isl=512, osl=1)[0]
    d128 = sum(x[1] for x in llama.decode_step_per_op(128, 4096, 1))
    assert f"{p512:.6f}" == "12.019275" and f"{d128:.6f}" == "28.816129", (p512, d128)
    print(f"dense check OK: llama-3.1-8b prefill 512 = {p512:.6f}, decode 128x4096 = {d128:.6f}")

    bd = open(out / "breakdown.txt", "w")
    for job in JOBS:
        if args.skip_deepseek and job["sim"] == "deepseek-v3":
            continue
        path = model_path(job["hf"], job["sim"])
        engine = EngineHandle.compile(path, job["system"], "vllm", backend_version=BACKEND_VERSION,
                                      **job["par"], **job["quant"])
        rows = rows_for(engine)
        with open(out / job["file"], "w") as fh:
            fh.write(header(job, core_version))
            fh.write("phase,batch_size,tokens,latency_ms,tp\n")
            for ph, b, t, v in rows:
                fh.write(f"{ph},{b},{t},{v:.6f},{job['tp']}\n")
        print(f"wrote {out / job['file']}")
        breakdown(engine, job["file"], bd)
    bd.close()


if __name__ == "__main__":
    sys.exit(main())
