"""The torch-native backend (the CPU path, and the reference of the triton kernels) with attention logit
soft-capping (Gemma 2's attn_logit_softcapping), alone and with a sliding window: extend over a cached prefix and
decode over a scattered KV pool, against transformers' own Gemma 2 eager attention (which caps, then masks, then
takes the softmax) fed the full keys and an additive causal/window mask."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

from types import SimpleNamespace

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode

HQ, HKV, D = 4, 2, 16
SCALE = 10.0**-0.5  # query_pre_attn_scalar 10: not head_dim^-0.5


def transformers_attention(q, k, v, query_pos, cap, window):
    """q [n, HQ, D] at positions `query_pos`, k/v [L, HKV, D] at positions 0..L-1 -> [n, HQ * D]."""
    key_pos = torch.arange(k.shape[0])
    visible = key_pos[None, :] <= query_pos[:, None]
    if window > 0:
        visible &= key_pos[None, :] > query_pos[:, None] - window
    mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    module = SimpleNamespace(num_key_value_groups=HQ // HKV, head_dim=D, training=False)
    out, _ = eager_attention_forward(
        module,
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        mask[None, None],
        scaling=SCALE,
        softcap=cap if cap > 0 else None,
    )
    return out[0].reshape(q.shape[0], HQ * D)


def batch(mode, rows, pool, backend, seq_lens, out_loc, prefix=None, ext=None):
    fb = SimpleNamespace(
        forward_mode=mode,
        batch_size=len(seq_lens),
        req_pool_indices=torch.arange(len(seq_lens)),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=list(seq_lens),
        out_cache_loc=out_loc,
        req_to_token_pool=rows,
        token_to_kv_pool=pool,
        attn_backend=backend,
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=ext,
    )
    backend.init_forward_metadata(fb)
    return fb


@pytest.mark.parametrize("cap,window", [(2.0, -1), (2.0, 6), (0.0, 6)])
def test_capped_extend_and_decode_match_transformers(cap, window):
    torch.manual_seed(0)
    pool = MHATokenToKVPool(96, 1, torch.float32, HKV, D, D, 1, "cpu")
    for buf in pool.k_buffer + pool.v_buffer:
        buf.fill_(float("nan"))  # a slot read but never written poisons the output
    rows = ReqToTokenPool(2, 48, "cpu")
    layer = RadixAttention(HQ, D, SCALE, HKV, layer_id=0, logit_cap=cap, sliding_window_size=window)
    backend = TorchNativeAttnBackend(SimpleNamespace(device="cpu"))
    lens, prefix = [9, 20], [0, 13]  # request 1: 13 tokens already cached, 7 new
    perm = torch.randperm(90) + 1  # scattered slots, distinct across requests; one more each for the decode step
    slots = [perm[:10], perm[10:31]]
    for i, s in enumerate(slots):
        rows.req_to_token[i, : len(s)] = s.to(torch.int32)
    # Logits well beyond the cap, so capping changes the answer.
    qs = [3 * torch.randn(n + 1, HQ, D) for n in lens]
    ks = [3 * torch.randn(n + 1, HKV, D) for n in lens]
    vs = [torch.randn(n + 1, HKV, D) for n in lens]
    pool.set_kv_buffer(0, slots[1][: prefix[1]], ks[1][: prefix[1]], vs[1][: prefix[1]])

    new = [slice(p, n) for p, n in zip(prefix, lens)]
    q = torch.cat([qs[i][new[i]] for i in range(2)]).reshape(-1, HQ * D)
    k = torch.cat([ks[i][new[i]] for i in range(2)]).reshape(-1, HKV * D)
    v = torch.cat([vs[i][new[i]] for i in range(2)]).reshape(-1, HKV * D)
    out_loc = torch.cat([slots[i][new[i]] for i in range(2)])
    fb = batch(ForwardMode.EXTEND, rows, pool, backend, lens, out_loc, prefix, [n - p for p, n in zip(prefix, lens)])
    out = backend.forward(q, k, v, layer, fb)
    start = 0
    for i, (p, n) in enumerate(zip(prefix, lens)):
        ref = transformers_attention(qs[i][p:n], ks[i][:n], vs[i][:n], torch.arange(p, n), cap, window)
        torch.testing.assert_close(out[start : start + n - p], ref, atol=1e-5, rtol=1e-5)
        start += n - p

    # Decode one token each at position lens[i] (slot slots[i][-1]).
    dq = torch.stack([qs[i][-1] for i in range(2)]).reshape(2, -1)
    dk = torch.stack([ks[i][-1] for i in range(2)]).reshape(2, -1)
    dv = torch.stack([vs[i][-1] for i in range(2)]).reshape(2, -1)
    fb = batch(ForwardMode.DECODE, rows, pool, backend, [n + 1 for n in lens], torch.stack([s[-1] for s in slots]))
    out = backend.forward(dq, dk, dv, layer, fb)
    assert torch.isfinite(out).all()
    for i, n in enumerate(lens):
        ref = transformers_attention(qs[i][-1:], ks[i], vs[i], torch.tensor([n]), cap, window)
        torch.testing.assert_close(out[i : i + 1], ref, atol=1e-5, rtol=1e-5)
        if cap > 0:  # the cap matters here: the uncapped attention is another answer
            plain = transformers_attention(qs[i][-1:], ks[i], vs[i], torch.tensor([n]), 0.0, window)
            assert not torch.allclose(ref, plain, atol=1e-3)
