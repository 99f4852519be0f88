"""How much does one long request cost the short ones beside it in a CPU decode step?

    python benchmark/cpu_throughput/bench_decode_padding.py --out benchmark/cpu_throughput/decode_padding

The torch-native backend (``srt/layers/attention/torch_native_backend.py``) attends a decode batch as padded
batches: before 2ad80ef as one, every request gathering and attending over the longest request's keys in every
layer, so a 3,000-token prompt beside 256 short samples made the step take minutes (``/health`` went 503); since,
a batch that would pad a lot is split into length classes (``decode_groups``). This times one layer's decode
attention with SmolLM2-135M's heads (9 query, 3 KV heads of 64, fp32, one thread) for a few batch mixes, as one
padded batch and as the backend splits it, and how far apart their outputs are (fp32 rounding of the
reductions over other lengths).
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch

import sglang.srt.layers.attention.torch_native_backend as tnb
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.bench_utils import write_results

HQ, HKV, D = 9, 3, 64  # SmolLM2-135M
MIXES = {  # name -> request lengths
    "256 x 16 + 1 x 3000": [16] * 256 + [3000],
    "16 x 100 + 1 x 3000": [100] * 16 + [3000],
    "64 x 200 (no split)": [200] * 64,
}


def layer_ms(lens: list[int], split: bool, repeats: int) -> tuple[float, torch.Tensor, int]:
    """Best-of-`repeats` ms of one layer's decode attention, its output, and the number of groups."""
    pool = MHATokenToKVPool(sum(lens) + 8, 1, torch.float32, HKV, D, D, 1, "cpu")
    rows = ReqToTokenPool(len(lens), max(lens) + 1, "cpu")
    gen = torch.Generator().manual_seed(0)
    for buf in pool.k_buffer + pool.v_buffer:
        buf.copy_(torch.randn(buf.shape, generator=gen))
    start = 1
    for i, n in enumerate(lens):
        rows.req_to_token[i, :n] = torch.arange(start, start + n, dtype=torch.int32)
        start += n
    layer = RadixAttention(HQ, D, D**-0.5, HKV, layer_id=0)
    threshold = tnb.SPLIT_MIN_PADDED_KEYS if split else 1 << 62  # never split: one padded batch, as before
    backend = tnb.TorchNativeAttnBackend(SimpleNamespace(device="cpu"), split_min_padded_keys=threshold)
    fb = SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(lens),
        req_pool_indices=torch.arange(len(lens)),
        seq_lens=torch.tensor(lens),
        seq_lens_cpu=list(lens),
        out_cache_loc=rows.req_to_token[torch.arange(len(lens)), torch.tensor(lens) - 1].long(),
        req_to_token_pool=rows,
        token_to_kv_pool=pool,
        attn_backend=backend,
    )
    backend.init_forward_metadata(fb)
    q, k, v = (torch.randn(len(lens), h * D, generator=gen) for h in (HQ, HKV, HKV))
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = backend.forward(q, k, v, layer, fb)
        best = min(best, time.perf_counter() - t)
    return best * 1e3, out, len(fb.attn_metadata)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="folder for results.json / results.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows, lines = (
        [],
        [
            "| batch | groups | one padded batch ms | split ms | speed-up | max abs diff |",
            "|---|---:|---:|---:|---:|---|",
        ],
    )
    for name, lens in MIXES.items():
        padded_ms, padded_out, _ = layer_ms(lens, split=False, repeats=args.repeats)
        split_ms, split_out, groups = layer_ms(lens, split=True, repeats=args.repeats)
        diff = (padded_out - split_out).abs().max().item()  # the reductions' order only: fp32 rounding
        rows.append(dict(batch=name, groups=groups, padded_ms=padded_ms, split_ms=split_ms, max_abs_diff=diff))
        lines.append(
            f"| {name} | {groups} | {padded_ms:.1f} | {split_ms:.1f} | {padded_ms / split_ms:.1f}x | {diff:.1e} |"
        )
    text = "One layer's decode attention, SmolLM2-135M's heads, fp32, one thread (best of %d)\n\n" % args.repeats
    text += "\n".join(lines)
    print(text)
    if args.out:
        write_results(args.out, dict(threads=1, rows=rows), text)


if __name__ == "__main__":
    main()
