from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")
register_cuda_ci(est_time=60, suite="per-commit-cuda")

# Triton decode / extend attention vs a plain torch reference over a shuffled paged KV pool.
# CPU: fp32 through the triton interpreter (tiny shapes). CUDA: bf16, larger shapes, plus a
# CUDA-graph replay with changed indices/lengths.

import math
import os

import pytest
import torch

from sglang.srt.layers.attention.triton_ops import (
    DecodeKernelConfig,
    decode_attention_fwd,
    decode_split_bounds,
    extend_attention_fwd,
    get_num_kv_splits,
)
from sglang.test.gpu_utils import triton_test_devices

_INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = triton_test_devices()


def _dtype_tol(device: str):
    return (torch.float32, 1e-4) if device == "cpu" else (torch.bfloat16, 2e-2)


def _softcap(s: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(s / cap) if cap > 0 else s


def _pool(num_slots, hkv, d, dv, dtype, device, gen):
    k = torch.randn(num_slots, hkv, d, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(num_slots, hkv, dv, generator=gen).to(device=device, dtype=dtype)
    return k, v


def _slots(lens, num_slots, idx_dtype, device, gen):
    """Shuffled, non-contiguous slot ids for each request, packed with an indptr."""
    perm = torch.randperm(num_slots, generator=gen)[: sum(lens)]
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0).to(torch.int32)
    return indptr.to(device), perm.to(device=device, dtype=idx_dtype)


def _ref_attn(q, k, v, scale, cap, mask=None):
    """q [M, Hq, D], k [L, Hkv, D], v [L, Hkv, Dv] -> [M, Hq, Dv], fp32."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    s = _softcap(torch.einsum("mhd,lhd->hml", q.float(), k) * scale, cap)
    if mask is not None:
        s = s.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(s, dim=-1), v)


def _ref_decode(q, k_buf, v_buf, indptr, indices, scale, cap):
    out = torch.zeros(q.shape[0], q.shape[1], v_buf.shape[-1])
    for i in range(q.shape[0]):
        s = indices[indptr[i] : indptr[i + 1]].long()
        if len(s):
            out[i] = _ref_attn(q[i : i + 1], k_buf[s], v_buf[s], scale, cap)[0].cpu()
    return out


def _ref_extend(q, k_ext, v_ext, k_buf, v_buf, qo_indptr, kv_indptr, indices, scale, causal, cap):
    out = torch.zeros(q.shape[0], q.shape[1], v_ext.shape[-1])
    for i in range(len(qo_indptr) - 1):
        a, b = int(qo_indptr[i]), int(qo_indptr[i + 1])
        s = indices[kv_indptr[i] : kv_indptr[i + 1]].long()
        k = torch.cat([k_buf[s], k_ext[a:b]])
        v = torch.cat([v_buf[s], v_ext[a:b]])
        mask = None
        if causal:  # new token j sees the whole prefix and new tokens 0..j
            rows = torch.arange(b - a, device=q.device)[:, None]
            cols = torch.arange(len(s) + b - a, device=q.device)[None, :] - len(s)
            mask = cols <= rows
        out[a:b] = _ref_attn(q[a:b], k, v, scale, cap, mask).cpu()
    return out


def _run_decode(device, lens, hq, hkv, d, dv, max_splits, idx_dtype, cap=0.0, splits=None, block_n=64, **config):
    dtype, tol = _dtype_tol(device)
    gen = torch.Generator().manual_seed(len(lens) * 1000 + hq * 10 + d + max_splits)
    num_slots = sum(lens) + 37
    k_buf, v_buf = _pool(num_slots, hkv, d, dv, dtype, device, gen)
    indptr, indices = _slots(lens, num_slots, idx_dtype, device, gen)
    bs = len(lens)
    q = torch.randn(bs, hq, d, generator=gen).to(device=device, dtype=dtype)
    o = torch.full((bs, hq, dv), float("nan"), device=device, dtype=dtype)
    logits = torch.empty(bs, hq, max_splits, dv, device=device, dtype=torch.float32)
    lse = torch.empty(bs, hq, max_splits, device=device, dtype=torch.float32)
    num_splits = torch.empty(bs, dtype=torch.int32, device=device)
    if splits is None:
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        get_num_kv_splits(num_splits, seq_lens, max_splits, min_block_tokens=64, block_n=block_n)
    else:
        num_splits.copy_(torch.tensor(splits, dtype=torch.int32))
    scale = 1.0 / math.sqrt(d)
    decode_attention_fwd(
        q,
        k_buf,
        v_buf,
        o,
        indptr,
        indices,
        logits,
        lse,
        num_splits,
        max_splits,
        scale,
        cap,
        DecodeKernelConfig(block_n=block_n, **config),
    )
    ref = _ref_decode(q, k_buf, v_buf, indptr, indices, scale, cap)
    real = torch.tensor([n > 0 for n in lens])
    assert torch.isfinite(o.float()).all(), "padding / real rows must be finite"
    torch.testing.assert_close(o.float().cpu()[real], ref[real], atol=tol, rtol=tol)
    if not real.all():
        assert (o.float().cpu()[~real] == 0).all(), "empty rows are written as zeros"


# (lens, hq, hkv, d, dv, max_kv_splits, index dtype, logit_cap)
DECODE_CASES = [
    ([1, 17, 300, 0], 4, 4, 64, 64, 4, torch.int64, 0.0),  # MHA, multi-split, padding row
    ([1, 17, 300], 6, 2, 96, 96, 1, torch.int32, 0.0),  # GQA 3, non-pow2 head dim, 1 split
    ([300, 0, 17], 8, 2, 64, 64, 4, torch.int32, 0.0),  # GQA 4
    ([17, 130], 8, 2, 64, 96, 3, torch.int64, 0.0),  # Dv > D (Dv non-pow2)
    ([300, 5], 8, 2, 64, 64, 2, torch.int64, 5.0),  # logit cap
    ([70], 20, 1, 64, 64, 2, torch.int32, 0.0),  # group 20 > BLOCK_H: two programs per kv head
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_n", [64, 128])  # 128 is the GPU default; chunks align to it
@pytest.mark.parametrize("lens,hq,hkv,d,dv,max_splits,idx_dtype,cap", DECODE_CASES)
def test_decode_matches_reference(device, block_n, lens, hq, hkv, d, dv, max_splits, idx_dtype, cap):
    if device == "cuda":  # scale up: longer contexts and a Llama-like head count
        lens = lens + [4096, 1000]
        hq, hkv = hq * 4, hkv * 4
        max_splits = max_splits * 4
    _run_decode(device, lens, hq, hkv, d, dv, max_splits, idx_dtype, cap, block_n=block_n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [0, 1, 2, 5])  # multi-split with padding, 1 split, GQA 4, two programs per kv head
@pytest.mark.parametrize(
    "config",
    [{"kv_heads_adjacent": False}, {"single_split_direct": False}],
    ids=["requests-adjacent", "one-chunk-via-stage-2"],
)
def test_decode_other_launch_choices_compute_the_same(device, case, config):
    """The other grid order (a kv head's programs for adjacent requests), and one-chunk requests merged by stage 2
    instead of written by stage 1 (the defaults are the other way: the cases above), give the same output."""
    lens, hq, hkv, d, dv, max_splits, idx_dtype, cap = DECODE_CASES[case]
    if device == "cuda":
        lens, hq, hkv = lens + [4096, 1000], hq * 4, hkv * 4
    _run_decode(device, lens, hq, hkv, d, dv, max_splits, idx_dtype, cap, **config)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_explicit_splits(device):
    """Split counts set by hand: above the chunk count (empty chunks), and out of range."""
    _run_decode(device, [3, 200, 64, 0], 4, 2, 64, 64, 4, torch.int64, splits=[4, 3, 4, 0])
    _run_decode(device, [130, 9], 4, 2, 64, 64, 2, torch.int32, splits=[7, 1])  # clamped to 2
    _run_decode(device, [1024, 65], 4, 2, 64, 64, 16, torch.int32, splits=[16, 2])  # one block per chunk
    _run_decode(device, [1000, 300], 4, 2, 64, 64, 16, torch.int32, splits=[16, 5], block_n=128)  # empty chunks


@pytest.mark.parametrize("device", DEVICES)
def test_get_num_kv_splits(device):
    seq_lens = torch.tensor([0, 1, 256, 257, 8192, 100000], dtype=torch.int32, device=device)
    out = torch.zeros(6, dtype=torch.int32, device=device)
    get_num_kv_splits(out, seq_lens, max_kv_splits=16, min_block_tokens=256)
    assert out.dtype == torch.int32
    assert out.cpu().tolist() == [1, 1, 1, 2, 16, 16]
    # Small batches raise the count toward min_splits, but never below 64 keys (one block) per chunk.
    get_num_kv_splits(out, seq_lens, max_kv_splits=16, min_block_tokens=256, min_splits=33, block_n=64)
    assert out.cpu().tolist() == [1, 1, 4, 5, 16, 16]
    get_num_kv_splits(out, seq_lens, max_kv_splits=16, min_block_tokens=256, min_splits=3, block_n=64)
    assert out.cpu().tolist() == [1, 1, 3, 3, 16, 16]
    get_num_kv_splits(out, seq_lens, max_kv_splits=16, min_block_tokens=1024, min_splits=33, block_n=128)
    assert out.cpu().tolist() == [1, 1, 2, 3, 16, 16]  # chunks of >= 128 keys


def test_decode_split_bounds_and_head_width_config():
    """H200-like numbers (132 SMs, 8 kv heads, 16 splits at most): batch 1 wants 33 chunks and gets a
    16-wide grid; batch 64 fills the SMs alone (1 chunk) and its grid is capped at 2."""
    assert decode_split_bounds(1, 8, 132, 16) == (33, 16)
    assert decode_split_bounds(8, 8, 132, 16) == (5, 9)
    assert decode_split_bounds(64, 8, 132, 16) == (1, 2)
    assert decode_split_bounds(512, 8, 132, 16) == (1, 1)
    assert DecodeKernelConfig.for_head_dim(128) == DecodeKernelConfig()
    assert DecodeKernelConfig.for_head_dim(256).block_n == 64  # wide heads keep the untuned earlier choice


# (prefix lens, extend lens, hq, hkv, d, dv, causal, index dtype, logit_cap)
EXTEND_CASES = [
    ([0, 0], [5, 40], 4, 4, 64, 64, True, torch.int64, 0.0),  # no prefix at all
    ([0, 33, 7], [20, 1, 35], 6, 2, 96, 96, True, torch.int32, 0.0),  # mixed prefixes, GQA 3
    ([50, 3], [9, 16], 8, 2, 64, 64, True, torch.int64, 4.0),  # GQA 4 + logit cap
    ([12, 0], [37, 3], 4, 2, 96, 64, False, torch.int32, 0.0),  # non-causal, Dv != D
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pre,ext,hq,hkv,d,dv,causal,idx_dtype,cap", EXTEND_CASES)
def test_extend_matches_reference(device, pre, ext, hq, hkv, d, dv, causal, idx_dtype, cap):
    dtype, tol = _dtype_tol(device)
    if device == "cuda":
        pre, ext = pre + [1000, 0], ext + [300, 513]
        hq, hkv = hq * 4, hkv * 4
    gen = torch.Generator().manual_seed(sum(pre) + sum(ext) + hq)
    num_slots = sum(pre) + 23
    k_buf, v_buf = _pool(num_slots, hkv, d, dv, dtype, device, gen)
    kv_indptr, indices = _slots(pre, num_slots, idx_dtype, device, gen)
    qo_indptr, _ = _slots(ext, sum(ext), torch.int64, device, gen)
    n = sum(ext)
    q = torch.randn(n, hq, d, generator=gen).to(device=device, dtype=dtype)
    k_ext, v_ext = _pool(n, hkv, d, dv, dtype, device, gen)
    o = torch.full((n, hq, dv), float("nan"), device=device, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    extend_attention_fwd(
        q,
        k_ext,
        v_ext,
        o,
        k_buf,
        v_buf,
        qo_indptr,
        kv_indptr,
        indices,
        max(ext),
        scale,
        is_causal=causal,
        logit_cap=cap,
    )
    ref = _ref_extend(q, k_ext, v_ext, k_buf, v_buf, qo_indptr, kv_indptr, indices, scale, causal, cap)
    torch.testing.assert_close(o.float().cpu(), ref, atol=tol, rtol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")
def test_decode_cuda_graph_replay_with_new_indices():
    """Capture once, then change indptr/indices/splits contents: replay must follow them."""
    dev, dtype, (hq, hkv, d, max_splits) = "cuda", torch.bfloat16, (32, 8, 128, 16)
    gen = torch.Generator().manual_seed(0)
    bs, num_slots, cap_tokens = 4, 9000, 8192
    k_buf, v_buf = _pool(num_slots, hkv, d, d, dtype, dev, gen)
    q = torch.randn(bs, hq, d, generator=gen).to(dev, dtype)
    o = torch.zeros(bs, hq, d, device=dev, dtype=dtype)
    indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
    indices = torch.zeros(cap_tokens, dtype=torch.int64, device=dev)
    seq_lens = torch.zeros(bs, dtype=torch.int32, device=dev)
    splits = torch.ones(bs, dtype=torch.int32, device=dev)
    logits = torch.empty(bs, hq, max_splits, d, device=dev, dtype=torch.float32)
    lse = torch.empty(bs, hq, max_splits, device=dev, dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)

    def step():
        get_num_kv_splits(splits, seq_lens, max_splits)
        decode_attention_fwd(q, k_buf, v_buf, o, indptr, indices, logits, lse, splits, max_splits, scale)

    step()  # warm up / compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for lens in ([5, 0, 300, 2000], [4000, 1, 0, 3000]):
        ip, idx = _slots(lens, num_slots, torch.int64, dev, gen)
        indptr.copy_(ip)
        indices[: len(idx)].copy_(idx)
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref = _ref_decode(q, k_buf, v_buf, ip, idx, scale, 0.0)
        real = torch.tensor([n > 0 for n in lens])
        assert torch.isfinite(o.float()).all()
        torch.testing.assert_close(o.float().cpu()[real], ref[real], atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_kv_cache_reads_as_its_dequantized_values(kv_dtype):
    """--kv-cache-dtype fp8_*: the pool holds bytes viewed as fp8 (memory_pool.kv_storage_dtype); decode and
    extend attention upcast each K/V tile (decode to fp16: decode_attention.dot_dtype), so they attend to the
    dequantized values: as the reference does, and as the kernels do over bf16 buffers holding them."""
    dev, (hq, hkv, d) = "cuda", (32, 8, 128)
    gen = torch.Generator().manual_seed(7)
    lens, num_slots = [1, 300, 2000], 2400
    k_fp8, v_fp8 = (
        t.to(kv_dtype).view(torch.uint8).view(kv_dtype) for t in _pool(num_slots, hkv, d, d, torch.float32, dev, gen)
    )
    k_deq, v_deq = k_fp8.to(torch.bfloat16), v_fp8.to(torch.bfloat16)
    indptr, indices = _slots(lens, num_slots, torch.int64, dev, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).to(dev, torch.bfloat16)
    scale, max_splits = 1.0 / math.sqrt(d), 4
    splits = torch.empty(len(lens), dtype=torch.int32, device=dev)
    get_num_kv_splits(splits, torch.tensor(lens, dtype=torch.int32, device=dev), max_splits)

    def decode(k_buf, v_buf):
        o = torch.empty(len(lens), hq, d, device=dev, dtype=torch.bfloat16)
        logits = torch.empty(len(lens), hq, max_splits, d, device=dev, dtype=torch.float32)
        lse = torch.empty(len(lens), hq, max_splits, device=dev, dtype=torch.float32)
        decode_attention_fwd(q, k_buf, v_buf, o, indptr, indices, logits, lse, splits, max_splits, scale)
        return o

    out = decode(k_fp8, v_fp8)
    ref = _ref_decode(q, k_deq, v_deq, indptr, indices, scale, 0.0)
    torch.testing.assert_close(out.float().cpu(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out, decode(k_deq, v_deq), atol=2e-2, rtol=2e-2)
    q[1, 0, 0] = 1e6  # beyond fp16: clamped for the fp16 dots, so the row's softmax stays finite
    assert torch.isfinite(decode(k_fp8, v_fp8).float()).all()

    ext = [5, 64, 1]
    qo_indptr, _ = _slots(ext, sum(ext), torch.int64, dev, gen)
    qe = torch.randn(sum(ext), hq, d, generator=gen).to(dev, torch.bfloat16)
    k_ext, v_ext = _pool(sum(ext), hkv, d, d, torch.bfloat16, dev, gen)

    def extend(k_buf, v_buf):
        o = torch.empty(sum(ext), hq, d, device=dev, dtype=torch.bfloat16)
        extend_attention_fwd(
            qe, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, indptr, indices, max(ext), scale, is_causal=True
        )
        return o

    out = extend(k_fp8, v_fp8)
    ref = _ref_extend(qe, k_ext, v_ext, k_deq, v_deq, qo_indptr, indptr, indices, scale, True, 0.0)
    torch.testing.assert_close(out.float().cpu(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out, extend(k_deq, v_deq), atol=1e-3, rtol=1e-3)  # both upcast to the query's bf16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")
def test_fp8_kv_cache_with_checkpoint_scales():
    """A checkpoint's k_scale / v_scale (model_loader/kv_scales.py): the pool stores k / k_scale, v / v_scale in
    e4m3 (memory_pool.MHATokenToKVPool.set_kv_buffer) and the kernels read them back times the scales, so they
    attend to the dequantized values. Here K/V reach ~2000, far beyond e4m3's 448: scale 1 would saturate."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    dev, (hq, hkv, d) = "cuda", (16, 4, 128)
    gen = torch.Generator().manual_seed(11)
    lens, num_slots = [1, 300, 1500], 1900
    k_true, v_true = (t * 500 for t in _pool(num_slots, hkv, d, d, torch.float32, dev, gen))
    k_scale, v_scale = k_true.abs().max().item() / 448, v_true.abs().max().item() / 448
    pool = MHATokenToKVPool(
        num_slots,
        page_size=1,
        dtype=torch.float8_e4m3fn,
        head_num=hkv,
        head_dim=d,
        v_head_dim=d,
        layer_num=1,
        device=dev,
    )
    loc = torch.arange(1, num_slots + 1, device=dev)
    pool.set_kv_buffer(0, loc, k_true.to(torch.bfloat16), v_true.to(torch.bfloat16), k_scale, v_scale)
    k_buf, v_buf = pool.get_key_buffer(0)[1:], pool.get_value_buffer(0)[1:]  # slot i of the test = pool slot i + 1
    k_deq, v_deq = k_buf.float() * k_scale, v_buf.float() * v_scale
    assert (k_deq - k_true).abs().max() < 0.07 * k_true.abs().max()  # e4m3's 3 mantissa bits, no saturation
    indptr, indices = _slots(lens, num_slots, torch.int64, dev, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).to(dev, torch.bfloat16) * 0.003
    scale, max_splits = 1.0 / math.sqrt(d), 4
    splits = torch.empty(len(lens), dtype=torch.int32, device=dev)
    get_num_kv_splits(splits, torch.tensor(lens, dtype=torch.int32, device=dev), max_splits)

    def decode(**scales):
        o = torch.empty(len(lens), hq, d, device=dev, dtype=torch.bfloat16)
        logits = torch.empty(len(lens), hq, max_splits, d, device=dev, dtype=torch.float32)
        lse = torch.empty(len(lens), hq, max_splits, device=dev, dtype=torch.float32)
        decode_attention_fwd(q, k_buf, v_buf, o, indptr, indices, logits, lse, splits, max_splits, scale, **scales)
        return o.float().cpu()

    ref = _ref_decode(q, k_deq, v_deq, indptr, indices, scale, 0.0)
    out = decode(k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(out, ref, atol=2e-2 * ref.abs().max().item(), rtol=2e-2)
    assert (decode() - ref).abs().max() > 10 * (out - ref).abs().max()  # the scales are what makes it right

    ext = [5, 64, 1]
    qo_indptr, _ = _slots(ext, sum(ext), torch.int64, dev, gen)
    qe = torch.randn(sum(ext), hq, d, generator=gen).to(dev, torch.bfloat16) * 0.003
    k_ext, v_ext = (t * 500 for t in _pool(sum(ext), hkv, d, d, torch.bfloat16, dev, gen))

    def extend(**scales):
        o = torch.empty(sum(ext), hq, d, device=dev, dtype=torch.bfloat16)
        extend_attention_fwd(
            qe, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, indptr, indices, max(ext), scale, is_causal=True, **scales
        )
        return o.float().cpu()

    ref = _ref_extend(qe, k_ext, v_ext, k_deq, v_deq, qo_indptr, indptr, indices, scale, True, 0.0)
    out = extend(k_scale=k_scale, v_scale=v_scale)  # the new tokens' K/V are used as computed, unscaled
    torch.testing.assert_close(out, ref, atol=2e-2 * ref.abs().max().item(), rtol=2e-2)
    assert (extend() - ref).abs().max() > 10 * (out - ref).abs().max()


def test_dot_dtype_is_the_querys_unless_the_kv_cache_is_fp8():
    from sglang.srt.layers.attention.triton_ops.decode_attention import dot_dtype

    assert dot_dtype(torch.bfloat16, torch.bfloat16) is torch.bfloat16
    assert dot_dtype(torch.float32, torch.float32) is torch.float32
    assert dot_dtype(torch.bfloat16, torch.float8_e4m3fn) is torch.float16
    assert dot_dtype(torch.bfloat16, torch.float8_e5m2) is torch.float16
    assert dot_dtype(torch.bfloat16, torch.float8_e4m3fn, fp8_dots_in_fp16=False) is torch.bfloat16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "max_splits,single_split_direct", [(4, True), (4, False), (1, True)], ids=["stage2", "all-via-stage2", "stage1"]
)
def test_decode_writes_its_output_quantized_for_a_block_fp8_o_proj(device, max_splits, single_split_direct):
    """With ``quantized`` (128-wide value heads: one 128-column group of o_proj's input each), the kernel that writes
    a head's output (stage 2, or stage 1 for a one-chunk request and an empty row) writes its fp8 codes and scale
    instead: the same bits as the output through the quantization kernel, the empty (padding) row as zero codes."""
    from sglang.srt.layers.attention.triton_ops.decode_attention import writes_quantized
    from sglang.srt.layers.quantization.block_fp8_activation import (
        ROW_MAJOR,
        ActivationLayout,
        empty_block_fp8_activation,
    )
    from sglang.srt.layers.quantization.fp8_block_kernels import quantize_groups

    dtype, _ = _dtype_tol(device)
    gen = torch.Generator().manual_seed(max_splits + single_split_direct)
    lens, hq, hkv, d = [1, 17, 300, 0], 8, 2, 128
    k_buf, v_buf = _pool(sum(lens) + 9, hkv, d, d, dtype, device, gen)
    v_buf *= 3
    indptr, indices = _slots(lens, sum(lens) + 9, torch.int32, device, gen)
    bs = len(lens)
    q = torch.randn(bs, hq, d, generator=gen).to(device=device, dtype=dtype)
    num_splits = torch.empty(bs, dtype=torch.int32, device=device)
    get_num_kv_splits(num_splits, torch.tensor(lens, dtype=torch.int32, device=device), max_splits, 64, 64)
    config = DecodeKernelConfig(block_n=64, single_split_direct=single_split_direct)

    def run(quantized=None):
        o = torch.zeros(bs, hq, d, device=device, dtype=dtype)
        logits = torch.empty(bs, hq, max_splits, d, device=device, dtype=torch.float32)
        lse = torch.empty(bs, hq, max_splits, device=device, dtype=torch.float32)
        decode_attention_fwd(
            q, k_buf, v_buf, o, indptr, indices, logits, lse, num_splits, max_splits, d**-0.5, 0.0, config,
            quantized=quantized,
        )  # fmt: skip
        return o

    want_q, want_scale = quantize_groups(run().view(bs, hq * d))
    got = empty_block_fp8_activation(bs, hq * d, dtype, ROW_MAJOR, torch.device(device))
    untouched = run(got)
    assert not untouched.any()  # the output went to the quantized buffers only
    assert torch.equal(got.q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(got.scale, want_scale)
    assert not got.q[3].float().any()  # the empty row
    assert writes_quantized(128, ROW_MAJOR) and not writes_quantized(64, ROW_MAJOR)
    assert not writes_quantized(128, ActivationLayout(4, True))  # cuBLAS's padded layout: the quantization kernel
    padded = empty_block_fp8_activation(bs, hq * d, dtype, ActivationLayout(4, True), torch.device(device))
    with pytest.raises(ValueError, match="row-major buffers of \\[4, 1024\\].*codes \\(4, 1024\\)"):
        run(padded)  # a layout the kernels cannot write is refused by name, never written wrongly
