"""Where a prefill chunk's time goes (Llama-3.1-8B shape, one GPU): the serving benchmark's chunks, by kernel.

    python benchmark/serving/profile_prefill.py [--shapes 8x1024 16x1024 1x8192] [--out DIR]

At concurrency 256 the serving benchmark (1,024 tokens in, 256 out) spends most of its time in prefill
chunks of `--chunked-prefill-size` tokens made of whole 1,024-token prompts (8 per 8k chunk). For each
shape `BxL` (B new prompts of L tokens, no cached prefix) this times our extend forward (eager, as the
server runs it), reports tokens/s and the model FLOP rate (linear layers + causal attention), and
profiles the same forwards with torch.profiler: kernel time by kind (GEMM, attention, the rest) and the
top kernels. Then, outside the model, the attention of the same shape with our triton extend kernel next
to torch's FlashAttention varlen kernel (when this torch has it), each linear layer's GEMM alone, and
the forward's GEMMs back to back without the rest of the model.
Prints tables; `--out` writes JSON.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "decode_roofline"))

from bench_decode_roofline import extend_batch, our_runner  # noqa: E402

from sglang.srt.configs.model_config import attention_head_dim, total_num_kv_heads  # noqa: E402
from sglang.test.gpu_utils import shape_config_dir  # noqa: E402

TFLOP = 1e12


def parse_shape(text: str) -> tuple[int, int]:
    batch, length = text.lower().split("x")
    return int(batch), int(length)


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    if "extend_fwd" in lowered or "flash" in lowered or "attention" in lowered:
        return "attention"
    if any(tag in lowered for tag in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "splitk")):
        return "gemm"
    return "other"


def timed_ms(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def model_flops(mr, batch: int, length: int) -> float:
    """Linear layers' FLOPs for every token (lm_head for one per prompt) + causal attention's two products."""
    cfg = mr.model_config.hf_config
    linear = sum(
        p.numel()
        for name, p in mr.model.named_parameters()
        if p.dim() == 2 and "embed" not in name and "lm_head" not in name
    )
    tokens = batch * length
    head_dim = attention_head_dim(cfg)
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * batch * length * (length + 1) / 2
    lm_head = 2 * batch * cfg.hidden_size * cfg.vocab_size
    return 2 * linear * tokens + attention + lm_head


def profile_forward(mr, fb, iters: int) -> tuple[dict, list]:
    mr.forward(fb)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            mr.forward(fb)
        torch.cuda.synchronize()
    per_kernel: dict = defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[evt.name][0] += evt.device_time / 1000.0 / iters
            per_kernel[evt.name][1] += 1 / iters
    by_kind: dict = defaultdict(float)
    for name, (ms, _) in per_kernel.items():
        by_kind[kernel_kind(name)] += ms
    top = sorted(((name, ms, calls) for name, (ms, calls) in per_kernel.items()), key=lambda r: -r[1])
    return dict(by_kind), top


def flash_varlen():
    """torch's FlashAttention varlen entry point, or None (with the reason printed) when this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        print(f"torch {torch.__version__} has no torch.nn.attention.varlen ({exc}): no FlashAttention row")
        return None
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    gqa = {"enable_gqa": True} if "enable_gqa" in params else {}

    def run(q, k, v, cu, max_len, scale):
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **causal, **gqa)

    print(f"torch {torch.__version__} varlen_attn{inspect.signature(varlen_attn)}")
    return run


def attention_rows(mr, batch: int, length: int, iters: int) -> dict:
    from sglang.srt.layers.attention.triton_ops import extend_attention_fwd

    cfg = mr.model_config.hf_config
    hq, hkv, d = cfg.num_attention_heads, total_num_kv_heads(cfg), attention_head_dim(cfg)
    n = batch * length
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    o = torch.empty_like(q)
    cu = torch.arange(0, n + 1, length, device="cuda", dtype=torch.int32)
    empty_indptr = torch.zeros(batch + 1, device="cuda", dtype=torch.int32)
    empty_indices = torch.zeros(1, device="cuda", dtype=torch.int32)
    scale = d**-0.5
    flops = 4 * hq * d * batch * length * (length + 1) / 2

    def ours():
        extend_attention_fwd(q, k, v, o, k, v, cu, empty_indptr, empty_indices, length, scale)

    row = {"triton_ms": timed_ms(ours, iters)}
    row["triton_TFLOPs"] = flops / (row["triton_ms"] / 1000) / TFLOP
    flash = flash_varlen()
    if flash is not None:
        ref = flash(q, k, v, cu, length, scale)
        ours()
        row["max_abs_diff_vs_flash"] = float((ref.float() - o.float()).abs().max())
        row["flash_ms"] = timed_ms(lambda: flash(q, k, v, cu, length, scale), iters)
        row["flash_TFLOPs"] = flops / (row["flash_ms"] / 1000) / TFLOP
    return row


def gemm_rows(mr, tokens: int, iters: int) -> list:
    """Each distinct linear weight of the first decoder layer as one bf16 matmul at M = tokens."""
    layer = mr.model.model.layers[0]
    rows = []
    for name, p in layer.named_parameters():
        if p.dim() != 2:
            continue
        x = torch.randn(tokens, p.shape[1], device="cuda", dtype=p.dtype)
        ms = timed_ms(lambda x=x, p=p: torch.matmul(x, p.t()), iters)
        rows.append(
            {
                "weight": name,
                "shape": list(p.shape),
                "ms": round(ms, 4),
                "TFLOPs": round(2 * tokens * p.numel() / (ms / 1000) / TFLOP, 1),
            }
        )
    # The same GEMMs as one forward runs them, every layer's in turn, nothing in between: a sustained load (a
    # GEMM alone for a few milliseconds runs at clocks a 200 ms forward does not keep).
    weights = [p for p in layer.parameters() if p.dim() == 2]
    inputs = [torch.randn(tokens, p.shape[1], device="cuda", dtype=p.dtype) for p in weights]
    num_layers = len(mr.model.model.layers)

    def forward_gemms() -> None:
        for _ in range(num_layers):
            for x, p in zip(inputs, weights):
                torch.matmul(x, p.t())

    ms = timed_ms(forward_gemms, iters)
    flops = 2 * tokens * sum(p.numel() for p in weights) * num_layers
    rows.append(
        {
            "weight": f"all, {num_layers} layers back to back",
            "shape": [],
            "ms": round(ms, 4),
            "TFLOPs": round(flops / (ms / 1000) / TFLOP, 1),
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="*", default=["8x1024", "16x1024", "1x8192"])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", help="write prefill_profile.json here")
    args = parser.parse_args()
    mr = our_runner(shape_config_dir("Llama-3.1-8B"))
    results = []
    for shape in args.shapes:
        batch, length = parse_shape(shape)
        fb, release = extend_batch(mr, batch, length)
        ms = timed_ms(lambda fb=fb: mr.forward(fb), args.iters)
        flops = model_flops(mr, batch, length)
        by_kind, top = profile_forward(mr, fb, args.iters)
        release()
        row = {
            "shape": shape,
            "tokens": batch * length,
            "forward_ms": round(ms, 2),
            "tokens_per_s": round(batch * length / ms * 1000, 1),
            "model_TFLOPs": round(flops / (ms / 1000) / TFLOP, 1),
            "kernel_ms_by_kind": {k: round(v, 2) for k, v in by_kind.items()},
            "top_kernels": [{"name": n[:120], "ms": round(t, 3), "calls": round(c, 1)} for n, t, c in top[:30]],
            "attention_alone": {k: round(v, 4) for k, v in attention_rows(mr, batch, length, args.iters).items()},
            "gemms_one_layer": gemm_rows(mr, batch * length, args.iters),
        }
        results.append(row)
        kinds = ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(row["kernel_ms_by_kind"].items()))
        print(
            f"\n{shape}: forward {row['forward_ms']} ms, {row['tokens_per_s']} tokens/s, "
            f"{row['model_TFLOPs']} TFLOP/s; kernels: {kinds}"
        )
        for name, t, calls in top[: args.top]:
            print(f"  {t:8.3f} ms  {calls:5.0f}x  {name[:100]}")
        print(f"  attention alone: {row['attention_alone']}")
        for g in row["gemms_one_layer"]:
            print(f"  gemm {g['weight']:<40} {str(g['shape']):<14} {g['ms']:8.4f} ms {g['TFLOPs']:7.1f} TFLOP/s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        payload = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": results}
        with open(os.path.join(args.out, "prefill_profile.json"), "w") as f:
            json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
