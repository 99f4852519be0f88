"""The triton MLA decode kernel (absorbed, over the latent pool) against the torch path (mla_torch.absorbed_decode):
CPU under TRITON_INTERPRET=1 (fp32, tiny shapes); on a GPU bf16 and a CUDA-graph replay with changed lengths."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")
register_cuda_ci(est_time=30, suite="per-commit-cuda")

import pytest
import torch

from sglang.srt.layers.attention.mla_torch import absorbed_decode
from sglang.srt.layers.attention.triton_ops.mla_decode import MLADecodeConfig, merge_splits, mla_decode_fwd
from sglang.srt.mem_cache.latent_store import store_latent_rows
from sglang.test.gpu_utils import triton_test_devices

DEVICES = triton_test_devices()
LORA, ROPE, NOPE, V = 32, 8, 16, 12


def _case(device, dtype, lens, heads, gen, slots=64):
    cache = torch.randn(slots, 1, LORA + ROPE, generator=gen).to(device=device, dtype=dtype)
    perm = torch.randperm(slots, generator=gen)
    indices, indptr, table = [], [0], []
    for n in lens:  # each request's rows at shuffled slots
        rows = perm[indptr[-1] : indptr[-1] + n]
        indices.append(rows)
        indptr.append(indptr[-1] + n)
        table.append(torch.cat([rows, torch.zeros(max(lens) - n, dtype=torch.long)]))
    kv_indices = torch.cat(indices).to(device=device, dtype=torch.int32)
    kv_indptr = torch.tensor(indptr, dtype=torch.int32, device=device)
    q_nope = torch.randn(len(lens), heads, NOPE, generator=gen).to(device=device, dtype=dtype)
    q_rope = torch.randn(len(lens), heads, ROPE, generator=gen).to(device=device, dtype=dtype)
    w_uk = (0.3 * torch.randn(heads, NOPE, LORA, generator=gen)).to(device=device, dtype=dtype)
    w_uv = (0.3 * torch.randn(heads, V, LORA, generator=gen)).to(device=device, dtype=dtype)
    table = torch.stack(table).to(device)
    valid = torch.arange(max(lens), device=device)[None, :] < torch.tensor(lens, device=device)[:, None]
    return cache, kv_indptr, kv_indices, q_nope, q_rope, w_uk, w_uv, table, valid


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,splits", [(4, 1), (4, 3), (20, 2)])  # 20 heads: two head blocks, one partial
def test_triton_mla_decode_matches_the_torch_path(device, heads, splits):
    dtype, tol = (torch.float32, 1e-4) if device == "cpu" else (torch.bfloat16, 2e-2)
    gen = torch.Generator().manual_seed(heads + splits)
    lens = [7, 1, 40, 0]  # a single row, several blocks, and an empty (graph padding) request
    cache, indptr, indices, q_nope, q_rope, w_uk, w_uv, table, valid = _case(device, dtype, lens, heads, gen)
    scale = (NOPE + ROPE) ** -0.5
    ref = absorbed_decode(q_nope, q_rope, cache[:, 0][table], valid, w_uk, w_uv, scale)
    q_latent = torch.einsum("bhn,hnc->bhc", q_nope, w_uk)
    context = mla_decode_fwd(q_latent, q_rope, cache, indptr, indices, scale, num_kv_splits=splits)
    assert context.shape == (len(lens), heads, LORA) and torch.isfinite(context).all()
    out = torch.einsum("bhc,hvc->bhv", context.to(dtype), w_uv)
    torch.testing.assert_close(out[:3].float(), ref[:3].float(), rtol=tol, atol=tol)
    assert torch.equal(context[3], torch.zeros_like(context[3]))  # no rows: zeros, never NaN


def test_kv_lora_rank_must_be_a_power_of_two():
    q = torch.zeros(1, 4, 24)
    with pytest.raises(ValueError, match="power-of-two"):
        mla_decode_fwd(q, torch.zeros(1, 4, 8), torch.zeros(4, 1, 32), torch.zeros(2, dtype=torch.int32),
                       torch.zeros(0, dtype=torch.int32), 1.0)  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "block_n,splits",
    [(16, 8), (32, 16), (16, 64)],  # 64 chunks of 16 rows: every request leaves most chunks empty
)
def test_many_splits_with_empty_chunks_match_the_torch_path(device, block_n, splits):
    """Chunks are whole BLOCK_N steps, so contexts shorter than splits x BLOCK_N leave the later chunks empty
    (they must weigh 0 in the merge), a request of 0 rows gets zeros, and the output comes in q's dtype."""
    dtype, tol = (torch.float32, 1e-4) if device == "cpu" else (torch.bfloat16, 2e-2)
    heads = 4
    gen = torch.Generator().manual_seed(block_n + splits)
    lens = [0, 3, block_n + 1, 5 * block_n - 1, 130]  # fewer rows than chunks, one step and a bit, several
    cache, indptr, indices, q_nope, q_rope, w_uk, w_uv, table, valid = _case(device, dtype, lens, heads, gen, 512)
    scale = (NOPE + ROPE) ** -0.5
    q_latent = torch.einsum("bhn,hnc->bhc", q_nope, w_uk)
    config = MLADecodeConfig(block_n=block_n)
    context = mla_decode_fwd(q_latent, q_rope, cache, indptr, indices, scale, num_kv_splits=splits, config=config)
    assert context.dtype == dtype and torch.equal(context[0], torch.zeros_like(context[0]))
    ref = absorbed_decode(q_nope[1:], q_rope[1:], cache[:, 0][table[1:]], valid[1:], w_uk, w_uv, scale)
    out = torch.einsum("bhc,hvc->bhv", context[1:], w_uv)
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")
def test_cuda_graph_replay_reads_new_lengths():
    """A captured decode (the config's split count for 4 rows: a fixed grid, several chunks) replayed after the
    lengths and slots changed in place: equal to the torch path on the new rows, the emptied request zeros."""
    dtype, tol, heads = torch.bfloat16, 2e-2, 16
    gen = torch.Generator().manual_seed(11)
    first = _case("cuda", dtype, [300, 5, 0, 64], heads, gen, 1024)
    second = _case("cuda", dtype, [17, 0, 290, 64], heads, gen, 1024)
    cache, indptr, indices, q_nope, q_rope, w_uk, w_uv = first[:7]
    scale = (NOPE + ROPE) ** -0.5
    q_latent = torch.einsum("bhn,hnc->bhc", q_nope, w_uk)
    indices = torch.cat([indices, torch.zeros(400, dtype=indices.dtype, device="cuda")])  # room for both
    out = torch.empty_like(q_latent)

    def step() -> None:
        mla_decode_fwd(q_latent, q_rope, cache, indptr, indices, scale, out=out)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    cache2, indptr2, indices2, q_nope2, q_rope2, _, _, table2, valid2 = second
    cache.copy_(cache2)
    indptr.copy_(indptr2)
    indices[: indices2.numel()].copy_(indices2)
    q_latent.copy_(torch.einsum("bhn,hnc->bhc", q_nope2, w_uk))
    q_rope.copy_(q_rope2)
    graph.replay()
    torch.cuda.synchronize()
    ref = absorbed_decode(q_nope2, q_rope2, cache2[:, 0][table2], valid2, w_uk, w_uv, scale)
    got = torch.einsum("bhc,hvc->bhv", out, w_uv)
    torch.testing.assert_close(got[[0, 2, 3]].float(), ref[[0, 2, 3]].float(), rtol=tol, atol=tol)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("device", DEVICES)
def test_latent_rows_are_stored_at_their_slots_only(device):
    """store_latent_rows (the kernel) and MLATokenToKVPool.set_mla_kv_buffer (the kernel on the GPU, torch on the
    CPU) write [latent | k_rope] at the given slots, k_rope a strided view of kv_a's rows; other slots untouched."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(3)
    kv_a = torch.randn(3, LORA + ROPE, generator=gen).to(device, dtype)
    latent, k_rope = torch.randn(3, LORA, generator=gen).to(device, dtype), kv_a[:, LORA:]
    loc = torch.tensor([7, 0, 4], device=device)
    want = torch.full((10, 1, LORA + ROPE), -1.0, dtype=dtype, device=device)
    want[loc, 0] = torch.cat([latent, k_rope], dim=-1)
    cache = torch.full_like(want, -1.0)
    store_latent_rows(cache, loc, latent, k_rope)
    assert torch.equal(cache, want)
    pool = MLATokenToKVPool(9, 1, dtype, LORA, ROPE, 1, device)
    pool.get_key_buffer(0).fill_(-1.0)
    pool.set_mla_kv_buffer(0, loc, latent, k_rope)
    assert torch.equal(pool.get_key_buffer(0), want)


def _merge_float64(partial: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The merge by definition, in float64: sum_s exp(lse_s) ctx_s / sum_s exp(lse_s), 0 where no chunk has rows."""
    p, w = partial.double(), torch.exp(lse.double())
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, (w[..., None] * p).sum(2) / total.clamp_min(1e-300), torch.zeros_like(p[:, :, 0]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits,out_dtype", [(5, torch.float32), (16, torch.float32), (3, torch.bfloat16)])
def test_merge_kernel_matches_a_float64_merge(device, splits, out_dtype):
    """Stage 2 against the float64 definition: large LSE gaps (one chunk dominates), empty chunks (lse -inf, their
    partial garbage: NaN, never read), a request whose chunks are all empty (zeros), output in the given dtype."""
    gen = torch.Generator().manual_seed(splits)
    bs, heads, d = 3, 4, 256  # 256 columns: two stage-2 column blocks
    partial = torch.randn(bs, heads, splits, d, generator=gen)
    lse = 20 * torch.randn(bs, heads, splits, generator=gen)
    lse[0, :, splits // 2 :] = float("-inf")
    lse[2] = float("-inf")
    partial[lse == float("-inf")] = float("nan")
    out = torch.full((bs, heads, d), 7.0, dtype=out_dtype, device=device)
    merged = merge_splits(partial.to(device), lse.to(device), out)
    assert merged is out
    ref = _merge_float64(torch.nan_to_num(partial, nan=0.0), lse)
    tol = 1e-5 if out_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double().cpu(), ref.to(out_dtype).double(), rtol=tol, atol=tol)
    assert torch.equal(out[2].cpu(), torch.zeros(heads, d, dtype=out_dtype))


def test_split_count_fills_whole_waves_and_stays_bounded():
    config = MLADecodeConfig(block_h=16, max_splits=32)
    sms = 132
    counts = [config.num_splits(rows, 16, sms) for rows in (1, 2, 16, 64, 132, 256, 1024)]
    # batch 1-2: capped; 16: 128 programs (one wave of eighth-length chunks; 16 or 32 chunks take 2 or 4 waves
    # of shorter ones: equal, and more partials); 64: 2 chunks (one wave), not 3 (192 programs: two waves of
    # third-length chunks); 132 and up: one chunk (stage 1 writes the output).
    assert counts == [32, 32, 8, 2, 1, 1, 1]
    for rows in (1, 3, 16, 50, 64, 100, 256):
        for heads in (16, 128):  # V2-Lite; V3's 8 head blocks per row
            n = config.num_splits(rows, heads, sms)
            assert 1 <= n <= 32
            programs = rows * heads // 16
            if programs * n <= sms:  # one wave: as many chunks as fit in it, up to the cap
                assert n == 32 or programs * (n + 1) > sms
    assert config.num_splits(1, 128, sms) == 16  # V3 batch 1: 128 programs, one wave
    assert config.num_splits(64, 128, sms) == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_matmul", [True, False], ids=["head-matmul", "bmm"])
def test_both_extend_forms_match_the_torch_path(device, head_matmul, monkeypatch):
    """An extend batch (requests with and without a cached prefix) through mla_triton's absorbed form (the latent
    kernel over each new token's causal slot list; W_UK and W_UV in head_matmul's kernel at these 15 tokens, or on
    torch.bmm past HEAD_MATMUL_MAX_TOKENS) and its decompressed form (kv_b_proj, then the extend kernel): both equal
    mla_torch.decompressed_attention per request."""
    from sglang.srt.layers.attention import mla_triton
    from sglang.srt.layers.attention.mla_torch import decompressed_attention
    from sglang.srt.layers.attention.mla_triton import absorbed_attention, decompressed_extend, token_row_lists

    monkeypatch.setattr(mla_triton, "HEAD_MATMUL_MAX_TOKENS", 64 if head_matmul else 0)

    dtype, tol = (torch.float32, 1e-4) if device == "cpu" else (torch.bfloat16, 3e-2)
    gen = torch.Generator().manual_seed(5)
    heads, slots = 6, 128
    prefixes, extends = [0, 13, 30], [5, 1, 9]
    cache = torch.randn(slots, 1, LORA + ROPE, generator=gen).to(device=device, dtype=dtype)
    perm = torch.randperm(slots, generator=gen)
    req_to_token = torch.zeros(4, 64, dtype=torch.int32)
    used = 0
    for i, (p, n) in enumerate(zip(prefixes, extends)):  # request i in row i + 1, its rows at shuffled slots
        req_to_token[i + 1, : p + n] = perm[used : used + p + n].to(torch.int32)
        used += p + n
    req_to_token = req_to_token.to(device)
    rows = torch.tensor([1, 2, 3], device=device)
    tokens = sum(extends)
    q_nope = torch.randn(tokens, heads, NOPE, generator=gen).to(device=device, dtype=dtype)
    q_rope = torch.randn(tokens, heads, ROPE, generator=gen).to(device=device, dtype=dtype)
    w_uk = (0.3 * torch.randn(heads, NOPE, LORA, generator=gen)).to(device=device, dtype=dtype)
    w_uv = (0.3 * torch.randn(heads, V, LORA, generator=gen)).to(device=device, dtype=dtype)
    scale = (NOPE + ROPE) ** -0.5

    def indptr(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)

    qo_indptr, kv_indptr = indptr(extends), indptr(prefixes)
    prefix_lens = torch.tensor(prefixes, device=device)
    kv_indices = torch.cat([req_to_token[r, :p] for r, p in zip(rows.tolist(), prefixes)])
    new_slots = torch.cat([req_to_token[r, p : p + n].long() for r, p, n in zip(rows.tolist(), prefixes, extends)])
    latent, k_rope = cache[new_slots, 0, :LORA], cache[new_slots, 0, LORA:]

    tok_indptr, tok_indices = token_row_lists(req_to_token, rows, prefix_lens, qo_indptr, prefixes, extends)
    assert (
        tok_indptr[-1].item() == tok_indices.numel() == sum(n * p + n * (n + 1) // 2 for p, n in zip(prefixes, extends))
    )
    absorbed = absorbed_attention(q_nope, q_rope, cache, w_uk, w_uv, tok_indptr, tok_indices, scale)
    decompressed = decompressed_extend(
        q_nope, q_rope, latent, k_rope, cache, w_uk, w_uv, qo_indptr, kv_indptr, kv_indices, max(extends), scale
    )
    start = 0
    for r, p, n in zip(rows.tolist(), prefixes, extends):
        own = cache[req_to_token[r, : p + n].long(), 0]
        ref = decompressed_attention(q_nope[start : start + n], q_rope[start : start + n], own, w_uk, w_uv, p, scale)
        torch.testing.assert_close(absorbed[start : start + n].float(), ref.float(), rtol=tol, atol=tol)
        torch.testing.assert_close(decompressed[start : start + n].float(), ref.float(), rtol=tol, atol=tol)
        start += n


def test_extend_form_rule_is_one_threshold():
    from sglang.srt.layers.attention.mla_triton import ABSORBED_EXTEND_MAX_TOKENS, use_absorbed_extend

    assert use_absorbed_extend([1, ABSORBED_EXTEND_MAX_TOKENS])
    assert not use_absorbed_extend([1, ABSORBED_EXTEND_MAX_TOKENS + 1])
