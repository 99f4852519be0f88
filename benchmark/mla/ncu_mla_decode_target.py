"""A target for Nsight Compute: the MLA latent kernel (triton_ops/mla_decode.py) on DeepSeek-V2-Lite's attention shape
(16 heads, kv_lora 512 + rope 64, bf16, context 1k, shuffled slots), launched a few times with the default config and
chunk count, nothing else on the GPU. `scripts/device/run.sh ncu-mla` profiles its third launch of stage 1:

    ncu --kernel-name regex:_mla_decode_stage1 --launch-skip 2 --launch-count 1 --section ... \
      python3 benchmark/mla/ncu_mla_decode_target.py [--batch 64]

(where the latent kernel's batch-64 time goes beyond its rows' floor: benchmark/mla/README.md). Without a GPU, under
TRITON_INTERPRET=1, it runs the same launches in the triton interpreter on a tiny case, so the script's own code is
checked on the CPU.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mla_decode import KV_LORA, ROPE, SHAPES, make_case  # noqa: E402

from sglang.srt.layers.attention.triton_ops.mla_decode import mla_decode_fwd  # noqa: E402

HEADS = SHAPES["DeepSeek-V2-Lite"]


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--launches", type=int, default=5)
    args = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":  # the interpreter: a tiny case
        args.batch, args.context = 2, 40
    case = make_case(HEADS, args.batch, args.context, KV_LORA, ROPE, dev, args.batch)
    for _ in range(args.launches):
        out = mla_decode_fwd(*case, 0.1)
    if dev == "cuda":
        torch.cuda.synchronize()
    print(f"ncu target: {args.launches} launches, batch {args.batch}, context {args.context}, {tuple(out.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
