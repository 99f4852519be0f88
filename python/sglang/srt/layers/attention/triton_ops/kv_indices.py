"""Per-batch attention metadata in one kernel: each request's KV slots, flattened, and its split count.

The torch version (``fill_kv_indices`` + ``get_num_kv_splits`` in the backend) is ~15 small kernels
(arange, searchsorted, gathers, the split arithmetic). Before every decode graph replay they ran outside
the graph, each a launch and a few microseconds of an otherwise idle GPU. Here one program per request
copies ``req_to_token[req, :len]`` to ``kv_indices[indptr[b]:indptr[b+1]]`` and, for decode, writes
``num_kv_splits[b]`` with the same rule as ``get_num_kv_splits``. Nothing syncs with the host.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sglang.srt.layers.kernel_dispatch import in_interpreter


@triton.jit
def _fill_kv_indices_kernel(
    Req_To_Token,
    Req_Pool_Indices,
    Kv_Indptr,
    Kv_Indices,
    Num_Kv_Splits,
    stride_req,
    max_splits,
    min_block_tokens,
    min_splits,
    block_n,
    BLOCK: tl.constexpr,
    WITH_SPLITS: tl.constexpr,
    WHILE_LOOPS: tl.constexpr,
):
    b = tl.program_id(0)
    req = tl.load(Req_Pool_Indices + b).to(tl.int64)
    start = tl.load(Kv_Indptr + b)
    n = tl.load(Kv_Indptr + b + 1) - start
    offs = tl.arange(0, BLOCK)
    src = Req_To_Token + req * stride_req
    if WHILE_LOOPS:  # interpreter: see kernel_dispatch
        i = 0
        while i < n:
            mask = i + offs < n
            tl.store(Kv_Indices + start + i + offs, tl.load(src + i + offs, mask=mask), mask=mask)
            i += BLOCK
    else:
        for i in range(0, n, BLOCK):
            mask = i + offs < n
            tl.store(Kv_Indices + start + i + offs, tl.load(src + i + offs, mask=mask), mask=mask)
    if WITH_SPLITS:
        splits = tl.cdiv(n, min_block_tokens)
        if min_splits > 1:
            splits = tl.maximum(splits, tl.minimum(tl.cdiv(n, block_n), min_splits))
        tl.store(Num_Kv_Splits + b, tl.minimum(tl.maximum(splits, 1), max_splits).to(tl.int32))


def fill_kv_indices_triton(
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    num_kv_splits: Optional[torch.Tensor] = None,
    max_kv_splits: int = 1,
    min_block_tokens: int = 1,
    min_splits: int = 1,
    block_n: int = 1,
) -> None:
    """out[indptr[b] + j] = req_to_token[req_pool_indices[b], j] for j < indptr[b+1] - indptr[b];
    with ``num_kv_splits``, also the decode split counts (arguments as in get_num_kv_splits)."""
    bs = req_pool_indices.shape[0]
    if bs == 0:
        return
    with_splits = num_kv_splits is not None
    _fill_kv_indices_kernel[(bs,)](
        req_to_token,
        req_pool_indices,
        kv_indptr,
        out,
        num_kv_splits if with_splits else out,
        req_to_token.stride(0),
        max(1, int(max_kv_splits)),
        int(min_block_tokens),
        int(min_splits),
        int(block_n),
        BLOCK=512,
        WITH_SPLITS=with_splits,
        WHILE_LOOPS=in_interpreter(out),
    )
