from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

# The torch-native attention backend (the CPU path and the reference for the triton kernels):
# extend with a cached prefix and decode over a paged, scattered KV pool, against plain attention.
# The pool starts as NaN everywhere: a slot that is read but was never written poisons the result.

from types import SimpleNamespace

import torch

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode

HQ, HKV, D = 4, 2, 8


def reference(q, k, v, n_new, scale):
    """Causal attention of the last n_new queries over all len(k) positions, GQA by repetition."""
    k = k.repeat_interleave(HQ // HKV, dim=1)
    v = v.repeat_interleave(HQ // HKV, dim=1)
    total = k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    pos_q = torch.arange(total - n_new, total)[:, None]
    scores = scores.masked_fill(torch.arange(total)[None, :] > pos_q, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v).reshape(n_new, HQ * D)


def make_env(page_size=1):
    pool = MHATokenToKVPool(64, page_size, torch.float32, HKV, D, D, 1, "cpu")
    for buf in pool.k_buffer + pool.v_buffer:
        buf.fill_(float("nan"))
    rows = ReqToTokenPool(4, 32, "cpu")
    layer = RadixAttention(HQ, D, D**-0.5, HKV, layer_id=0)
    return pool, rows, layer, TorchNativeAttnBackend(SimpleNamespace(device="cpu"))


def fb(mode, rows, pool, backend, seq_lens, out_loc, prefix=None, ext=None):
    f = SimpleNamespace(
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
    backend.init_forward_metadata(f)
    return f


def test_extend_then_decode_match_plain_attention():
    torch.manual_seed(0)
    pool, rows, layer, backend = make_env()
    lens = [5, 11]
    # Scattered slots, as a long-running pool hands them out.
    slots = [torch.tensor([9, 3, 40, 41, 17]), torch.tensor([2, 30, 31, 5, 6, 7, 60, 61, 62, 12, 13])]
    ks = [torch.randn(n, HKV, D) for n in lens]
    vs = [torch.randn(n, HKV, D) for n in lens]
    qs = [torch.randn(n, HQ, D) for n in lens]
    # Request 1 has a cached prefix of 4 tokens already in the pool; request 0 prefills everything.
    pool.set_kv_buffer(0, slots[1][:4], ks[1][:4], vs[1][:4])
    for i, s in enumerate(slots):
        rows.req_to_token[i, : len(s)] = s.to(torch.int32)
    prefix, ext = [0, 4], [5, 7]
    q = torch.cat([qs[0], qs[1][4:]]).reshape(-1, HQ * D)
    k = torch.cat([ks[0], ks[1][4:]]).reshape(-1, HKV * D)
    v = torch.cat([vs[0], vs[1][4:]]).reshape(-1, HKV * D)
    out_loc = torch.cat([slots[0], slots[1][4:]])
    f = fb(ForwardMode.EXTEND, rows, pool, backend, lens, out_loc, prefix, ext)
    out = backend.forward(q, k, v, layer, f)
    assert torch.allclose(out[:5], reference(qs[0], ks[0], vs[0], 5, layer.scaling), atol=1e-5)
    assert torch.allclose(out[5:], reference(qs[1][4:], ks[1], vs[1], 7, layer.scaling), atol=1e-5)
    # Decode one token each (new slots 50 and 51); the rows' tails beyond seq_len point at slot 0.
    new_k, new_v, new_q = torch.randn(2, HKV, D), torch.randn(2, HKV, D), torch.randn(2, HQ, D)
    rows.req_to_token[0, 5] = 50
    rows.req_to_token[1, 11] = 51
    f = fb(ForwardMode.DECODE, rows, pool, backend, [6, 12], torch.tensor([50, 51]))
    out = backend.forward(new_q.reshape(2, -1), new_k.reshape(2, -1), new_v.reshape(2, -1), layer, f)
    assert not torch.isnan(out).any(), "a padded (never written) slot leaked into the output"
    for i in range(2):
        k_all = torch.cat([ks[i], new_k[i : i + 1]])
        v_all = torch.cat([vs[i], new_v[i : i + 1]])
        ref = reference(new_q[i : i + 1], k_all, v_all, 1, layer.scaling)
        assert torch.allclose(out[i : i + 1], ref, atol=1e-5)


def test_decode_groups_split_only_a_batch_that_pads_a_lot():
    from sglang.srt.layers.attention.torch_native_backend import SPLIT_MIN_PADDED_KEYS, decode_groups

    assert decode_groups([5, 9, 7]) == [[0, 1, 2]]  # little padding: one group
    long = SPLIT_MIN_PADDED_KEYS + 3000
    assert decode_groups([long] * 8) == [list(range(8))]  # all long, no padding
    # One long request among many short ones: the short ones no longer pad to it; each class within 2x.
    lens = [10] * 100 + [long] + [12, 3]
    groups = decode_groups(lens)
    assert sorted(i for g in groups for i in g) == list(range(len(lens)))
    assert [100] in groups and [102] in groups and list(range(100)) + [101] in groups  # 10 and 12: one class
    for g in groups:
        assert max(lens[i] for i in g) <= 2 * min(lens[i] for i in g)


def test_a_split_decode_batch_matches_plain_attention():
    torch.manual_seed(1)
    pool, rows, layer, backend = make_env()
    backend.split_min_padded_keys = 0  # split this small batch as a long one would be
    lens = [3, 30, 4]  # the long one in the middle: the output rows go back to their places
    free = torch.randperm(63)[: sum(lens)] + 1  # scattered slots, never slot 0
    slots = list(free.split(lens))
    ks = [torch.randn(n, HKV, D) for n in lens]
    vs = [torch.randn(n, HKV, D) for n in lens]
    for i, s in enumerate(slots):
        pool.set_kv_buffer(0, s[:-1], ks[i][:-1], vs[i][:-1])
        rows.req_to_token[i, : len(s)] = s.to(torch.int32)
    q = torch.randn(3, HQ, D)
    f = fb(ForwardMode.DECODE, rows, pool, backend, lens, torch.stack([s[-1] for s in slots]))
    assert len(f.attn_metadata) == 2  # lengths 3 and 4 together, 30 alone
    new_k = torch.stack([k[-1] for k in ks]).reshape(3, -1)
    new_v = torch.stack([v[-1] for v in vs]).reshape(3, -1)
    out = backend.forward(q.reshape(3, -1), new_k, new_v, layer, f)
    assert not torch.isnan(out).any()
    for i in range(3):
        ref = reference(q[i : i + 1], ks[i], vs[i], 1, layer.scaling)
        assert torch.allclose(out[i : i + 1], ref, atol=1e-5)
