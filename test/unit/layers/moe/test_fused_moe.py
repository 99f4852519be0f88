from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")
register_cuda_ci(est_time=60, suite="per-commit-cuda")

# Routing, the torch MoE, the triton fused MoE (interpreter on CPU) and the FusedMoE layer.

import os
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.moe.fused_moe_native import fused_moe_native
from sglang.srt.layers.moe.fused_moe_triton import (
    MoEGemmConfigs,
    MoEKernelConfig,
    fused_experts_triton,
    invoke_moe_gemm,
    moe_align_block_size,
    moe_align_block_size_torch,
    moe_align_block_size_triton,
    moe_sum,
)
from sglang.srt.layers.moe.layer import FusedMoE
from sglang.srt.layers.moe.topk import select_experts
from sglang.srt.layers.quantization import get_moe_method
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase

CUDA_SKIP = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")
# Triton on CPU tensors only works in the interpreter (conftest turns it on when there is no GPU).
INTERP_SKIP = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="CPU triton cases need TRITON_INTERPRET=1 (set without a GPU)"
)
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA_SKIP)]
TRITON_DEVICES = [pytest.param("cpu", marks=INTERP_SKIP), pytest.param("cuda", marks=CUDA_SKIP)]


def _dense_reference(x, w1, w3, w2, topk_weights, topk_ids) -> torch.Tensor:
    """Token by token, slot by slot, in float64: the definition of the MoE output."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if e < 0:
                continue
            xt = x[t].double()
            h = F.silu(w1[e].double() @ xt) * (w3[e].double() @ xt)
            out[t] += float(topk_weights[t, j]) * (w2[e].double() @ h)
    return out


def _random_experts(num_experts: int, hidden: int, inter: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(num_experts, inter, hidden, generator=g) / hidden**0.5
    w3 = torch.randn(num_experts, inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    return w1, w3, w2


def _loaded_layer(method: FusedMoEMethodBase, w1, w3, w2, dtype, device) -> torch.nn.Module:
    layer = torch.nn.Module()
    with torch.device(device):
        method.create_weights(layer, w1.shape[0], w1.shape[2], w1.shape[1], dtype)
    for e in range(w1.shape[0]):
        method.load_expert(layer, e, "w1", w1[e])
        method.load_expert(layer, e, "w3", w3[e])
        method.load_expert(layer, e, "w2", w2[e])
    return layer


def _routing(num_tokens: int, num_experts: int, top_k: int, seed: int, masked: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g)
    weights, ids = select_experts(logits, top_k, renormalize=True)
    if masked:
        flat = ids.view(-1)
        flat[torch.randperm(flat.numel(), generator=g)[:masked]] = -1
    return weights, ids


# ---------------------------------------------------------------- routing


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_select_experts_matches_softmax_topk(renormalize: bool, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    # Distinct logits per row (a permutation times 0.25, exact in bf16): no ties to break differently.
    logits = torch.stack([torch.randperm(16, generator=g) for _ in range(37)]).to(dtype) * 0.25
    weights, ids = select_experts(logits, 4, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert weights.shape == ids.shape == (37, 4)

    probs = torch.softmax(logits.double(), dim=-1)
    ref_probs, ref_ids = torch.sort(probs, dim=-1, descending=True)
    ref_ids, ref_w = ref_ids[:, :4], ref_probs[:, :4]
    if renormalize:
        ref_w = ref_w / ref_w.sum(-1, keepdim=True)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights.double(), ref_w, rtol=1e-6, atol=1e-7)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(37), rtol=1e-6, atol=1e-6)
    else:
        assert bool((weights.sum(-1) < 1).all())


ALIGN_IMPLS = [
    pytest.param(moe_align_block_size_torch, id="torch"),
    pytest.param(moe_align_block_size_triton, id="triton", marks=INTERP_SKIP),
]


@pytest.mark.parametrize("align", ALIGN_IMPLS)
def test_moe_align_block_size_groups_slots_by_expert(align) -> None:
    num_experts, block_m = 5, 4
    _, ids = _routing(11, num_experts, 3, seed=2, masked=4)
    r = align(ids, block_m, num_experts)
    flat = ids.view(-1).long()
    num_slots = flat.numel()
    used = int(r.num_padded.item())
    sorted_ids = r.sorted_slot_ids.long()

    counts = torch.bincount(flat[flat >= 0], minlength=num_experts)
    assert used == int(((counts + block_m - 1) // block_m * block_m).sum())
    assert sorted_ids.numel() % block_m == 0 and sorted_ids.numel() >= used
    real = sorted_ids[sorted_ids < num_slots]
    # Every routed slot exactly once, no masked slot at all.
    assert sorted(real.tolist()) == torch.nonzero(flat >= 0).squeeze(1).tolist()
    for tile, expert in enumerate(r.expert_ids.tolist()):
        rows = sorted_ids[tile * block_m : (tile + 1) * block_m]
        if tile * block_m >= used:
            assert expert == -1 and bool((rows == num_slots).all())
            continue
        rows = rows[rows < num_slots]
        assert rows.numel() > 0 and bool((flat[rows] == expert).all())


def _random_ids(num_tokens: int, top_k: int, num_experts: int, skipped: int, seed: int) -> torch.Tensor:
    """Distinct experts per token (as a top-k gives), `skipped` random slots set to -1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(num_tokens)]).int()
    ids.view(-1)[torch.randperm(ids.numel(), generator=g)[:skipped]] = -1
    return ids


# (tokens, top_k, experts, skipped slots): decode batches, skipped ids, experts with no tokens, more experts
# than slots, several slot chunks in the kernel (V3's 256 experts: 32-slot chunks), every slot skipped.
ALIGN_CASES = [(1, 6, 64, 0), (7, 2, 6, 3), (33, 4, 8, 10), (3, 8, 256, 0), (64, 6, 64, 20), (40, 2, 4, 80)]


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("block_m", [16, 32, 64])
@pytest.mark.parametrize("num_tokens,top_k,num_experts,skipped", ALIGN_CASES)
def test_moe_align_kernel_matches_torch(
    device: str, block_m: int, num_tokens: int, top_k: int, num_experts: int, skipped: int
) -> None:
    ids = _random_ids(num_tokens, top_k, num_experts, skipped, seed=num_tokens * 31 + block_m).to(device)
    ref = moe_align_block_size_torch(ids, block_m, num_experts)
    out = moe_align_block_size_triton(ids, block_m, num_experts)
    for field in ("sorted_slot_ids", "expert_ids", "num_padded"):
        got, want = getattr(out, field), getattr(ref, field)
        assert got.dtype == want.dtype == torch.int32 and torch.equal(got, want), field
    if skipped < ids.numel():  # at least one expert has tokens: some tile is owned and some is past the end
        assert int(out.expert_ids[0]) >= 0
    assert int(out.num_padded) % block_m == 0


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_moe_sum_skips_unrouted_slots(device: str) -> None:
    """Skipped slots' rows are never written by the GEMM (garbage, here NaN): the sum must not read them."""
    ids = _random_ids(5, 3, 8, skipped=4, seed=7)
    ids[2] = -1  # a token with no routed slot comes out as exact zeros
    cache = torch.randn(15, 1100, generator=torch.Generator().manual_seed(8))  # 1100: a ragged second block
    cache[ids.view(-1) < 0] = float("nan")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    out = moe_sum(cache.to(device, dtype), ids.to(device)).cpu()
    routed = torch.where((ids.view(-1) >= 0)[:, None], cache.to(dtype).float(), 0.0)
    ref = routed.view(5, 3, -1).sum(dim=1).to(dtype)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert bool((out[2] == 0).all())


# ---------------------------------------------------------------- torch MoE


def test_native_matches_dense_reference() -> None:
    w1, w3, w2 = _random_experts(6, 48, 40, seed=3)
    x = torch.randn(13, 48, generator=torch.Generator().manual_seed(4))
    weights, ids = _routing(13, 6, 2, seed=5)
    out = fused_moe_native(x, weights, ids, lambda e: (torch.cat((w1[e], w3[e])), w2[e]))
    ref = _dense_reference(x, w1, w3, w2, weights, ids)
    assert out.dtype == x.dtype
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_native_masked_slots_contribute_nothing() -> None:
    w1, w3, w2 = _random_experts(4, 32, 24, seed=6)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(7))
    weights, ids = _routing(9, 4, 2, seed=8)
    ids[0, :] = -1  # a token whose experts all live elsewhere
    ids[3, 1] = -1
    ids[5, 0] = -1

    def dense(e: int):
        return torch.cat((w1[e], w3[e])), w2[e]

    out = fused_moe_native(x, weights, ids, dense)
    assert bool((out[0] == 0).all())
    # Same as giving those slots weight zero on any real expert.
    zeroed_w = torch.where(ids < 0, 0.0, weights)
    out_zero = fused_moe_native(x, zeroed_w, ids.clamp(min=0), dense)
    torch.testing.assert_close(out, out_zero, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), _dense_reference(x, w1, w3, w2, weights, ids), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- triton fused MoE vs torch

# (method, T, masked slots, kernel config or None for the default). H=160 leaves ragged K/N tiles and
# gives w13 two 128-wide scale groups along K; the configs cover both scale paths (one scale per
# tile column vs one per element).
TRITON_CASES = [
    ("BF16", 7, 0, None),
    ("FP8", 33, 3, MoEKernelConfig(16, 32, 64)),
    ("INT8", 1, 0, None),
    ("FP8_PERCHANNEL", 21, 2, MoEKernelConfig(16, 64, 64)),
    ("FP8", 1, 1, None),  # one token (no alignment), all its experts elsewhere
    ("INT4", 17, 2, None),
    ("INT4_G32", 9, 0, MoEKernelConfig(16, 64, 64)),
    ("MXFP4", 12, 1, MoEKernelConfig(16, 64, 32)),
    ("MXFP4", 40, 0, None),
    # two codes a byte on a 16-wide K tile (run at 32: each of the two nibble dots spans half a step), groups of 16
    # narrower than that (one scale per element)
    ("INT4_G16", 5, 1, MoEKernelConfig(16, 32, 16)),
    ("MXFP4", 3, 0, MoEKernelConfig(16, 32, 16)),
    # one token with its experts here, on the default configs (the down GEMM's own, BLOCK_N 256), every layout
    ("BF16", 1, 0, None),
    ("FP8", 1, 0, None),
    ("FP8_PERCHANNEL", 1, 0, None),
    ("INT4", 1, 0, None),
    ("INT4_G32", 1, 0, None),
    ("MXFP4", 1, 0, None),
]


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("name,num_tokens,masked,config", TRITON_CASES)
def test_triton_matches_native(
    device: str, name: str, num_tokens: int, masked: int, config: Optional[MoEKernelConfig]
) -> None:
    num_experts, hidden, inter, top_k = 6, 160, 128, 2
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    method = get_moe_method(name)  # INT4_G<n>: INT4 in groups of n
    layer = _loaded_layer(method, *_random_experts(num_experts, hidden, inter, seed=9), dtype, device)
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(10)).to(device, dtype)
    weights, ids = _routing(num_tokens, num_experts, top_k, seed=11, masked=masked)
    if masked:
        ids[0] = -1  # a token whose experts all live elsewhere must come out as exactly zero
    weights, ids = weights.to(device), ids.to(device)

    w13, w2 = method.gemm_weights(layer)
    out = fused_experts_triton(x, w13, w2, weights, ids, config and MoEGemmConfigs.both(config))
    ref = method.apply(layer, x, weights, ids, backend="native")
    assert out.shape == x.shape and out.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= tol * ref.float().abs().max().item(), f"{name}: max abs err {err}"
    for t in range(num_tokens):
        if bool((ids[t] < 0).all()):
            assert bool((out[t] == 0).all())


def test_narrow_scale_groups_fit_the_tiles() -> None:
    """Two-codes-a-byte weights (INT4, MXFP4) keep the config's BLOCK_K (at least 32: two dots of half a step) and
    apply their power-of-two groups a group at a time inside it (a per-element scale tile at the one-token down
    GEMM's BLOCK_N 256 needs more shared memory than an H100 has); block-fp8 groups narrower than BLOCK_K set it;
    formats without K groups keep the config."""
    from sglang.srt.layers.moe.fused_moe_triton.fused_moe import ONE_TOKEN_DOWN_CONFIG, fit_scale_groups, tile_groups
    from sglang.srt.layers.moe.weight_format import MoEGemmWeight, WeightQuant

    def weight(quant: WeightQuant, group_k: int) -> MoEGemmWeight:
        return MoEGemmWeight(torch.empty(1, 8, 64, dtype=torch.uint8), torch.empty(1, 8, 4), quant, 1, group_k)

    down = ONE_TOKEN_DOWN_CONFIG  # BLOCK_K 128
    for quant, group, groups in (
        (WeightQuant.INT4_GROUP, 32, 4),
        (WeightQuant.MXFP4, 32, 4),
        (WeightQuant.INT4_GROUP, 64, 2),
    ):
        assert fit_scale_groups(down, weight(quant, group)) == down
        assert tile_groups(down, weight(quant, group)) == groups
    narrow = MoEKernelConfig(16, 32, 16)
    assert fit_scale_groups(narrow, weight(WeightQuant.INT4_GROUP, 16)).block_k == 32
    assert (
        tile_groups(fit_scale_groups(narrow, weight(WeightQuant.INT4_GROUP, 16)), weight(WeightQuant.INT4_GROUP, 16))
        == 2
    )
    with pytest.raises(ValueError, match="power of two >= 16, got 48"):
        tile_groups(down, weight(WeightQuant.INT4_GROUP, 48))
    wide_k = MoEKernelConfig(16, 64, 256)
    assert fit_scale_groups(wide_k, weight(WeightQuant.FP8_BLOCK, 128)).block_k == 128
    assert fit_scale_groups(down, weight(WeightQuant.INT4_GROUP, 128)) == down
    assert tile_groups(down, weight(WeightQuant.INT4_GROUP, 128)) == 1  # a group spans the step
    assert tile_groups(MoEKernelConfig(16, 64, 256), weight(WeightQuant.INT4_GROUP, 128)) == 2
    assert fit_scale_groups(down, weight(WeightQuant.INT8_CHANNEL, 0)) == down


def test_one_token_tiles_by_weight_format() -> None:
    """One token's GEMMs: two-codes-a-byte weights (INT4 groups, MXFP4) take ONE_TOKEN_PACKED_CONFIG for both (256 inputs
    a K step: 8 scale groups of 32 in a step, 2 of 128), the others DECODE_CONFIG and the down GEMM's own; more tokens
    the same tiles for every format."""
    from sglang.srt.layers.moe.fused_moe_triton.fused_moe import (
        DECODE_CONFIG,
        ONE_TOKEN_DOWN_CONFIG,
        ONE_TOKEN_PACKED_CONFIG,
        default_configs,
        tile_groups,
    )
    from sglang.srt.layers.moe.weight_format import MoEGemmWeight, WeightQuant

    packed = default_configs(1, 8, 128, packed=True)
    assert packed.up == packed.down == ONE_TOKEN_PACKED_CONFIG
    assert default_configs(1, 8, 128) == MoEGemmConfigs(DECODE_CONFIG, ONE_TOKEN_DOWN_CONFIG)
    assert default_configs(9, 8, 128, packed=True) == default_configs(9, 8, 128) == MoEGemmConfigs.both(DECODE_CONFIG)
    for group, groups in ((32, 8), (128, 2)):
        codes = MoEGemmWeight(torch.empty(1, 8, 512, dtype=torch.uint8), None, WeightQuant.INT4_GROUP, group_k=group)
        assert codes.packed and tile_groups(ONE_TOKEN_PACKED_CONFIG, codes) == groups


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("name", ["INT4_G32", "MXFP4"])
@pytest.mark.parametrize("num_tokens", [1, 9])
def test_narrow_groups_over_a_long_k_on_the_default_configs(device: str, name: str, num_tokens: int) -> None:
    """Groups of 32 on the default configs with a K of several tiles (the down GEMM's 512 inputs): what ran out of
    shared memory on an H100 at DeepSeek-V3's shape before fit_scale_groups; four groups a 128-wide K step; the triton
    result equals torch's."""
    num_experts, hidden, inter, top_k = 4, 256, 512, 2
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    method = get_moe_method(name)
    layer = _loaded_layer(method, *_random_experts(num_experts, hidden, inter, seed=41), dtype, device)
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(42)).to(device, dtype)
    weights, ids = _routing(num_tokens, num_experts, top_k, seed=43)
    weights, ids = weights.to(device), ids.to(device)
    w13, w2 = method.gemm_weights(layer)
    out = fused_experts_triton(x, w13, w2, weights, ids)
    ref = method.apply(layer, x, weights, ids, backend="native")
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= tol * ref.float().abs().max().item(), f"{name}: max abs err {err}"


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("name", ["BF16", "FP8"])
def test_one_token_gemms_skip_the_alignment_with_the_same_bits(device: str, name: str) -> None:
    """One token's slots as GEMM tiles of their own (the batch-1 path, no align kernel) write every routed slot's
    row with the bits the aligned routing gives it (each tile holds the one real row either way), in both GEMMs;
    a slot computed elsewhere (-1) gets no row written."""
    num_experts, hidden, inter, top_k = 6, 160, 128, 3
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    method = get_moe_method(name)
    layer = _loaded_layer(method, *_random_experts(num_experts, hidden, inter, seed=21), dtype, device)
    w13, w2 = method.gemm_weights(layer)
    x = torch.randn(1, hidden, generator=torch.Generator().manual_seed(22)).to(device, dtype)
    weights, ids = _routing(1, num_experts, top_k, seed=23)
    ids[0, 1] = -1
    weights, ids = weights.to(device), ids.to(device)
    config = MoEKernelConfig(16, 64, 64)
    aligned = moe_align_block_size(ids, config.block_m, num_experts)
    slot_weights = weights.reshape(-1).float()
    caches = []
    for routing in (ids.reshape(-1), aligned):
        cache1 = torch.full((top_k, w13.n), 7.0, dtype=dtype, device=device)
        invoke_moe_gemm(x, w13, cache1, routing, top_k, top_k, None, config)
        cache2 = torch.full((top_k, w2.n), 7.0, dtype=dtype, device=device)
        invoke_moe_gemm(cache1, w2, cache2, routing, top_k, 1, slot_weights, config, a_gated=True)
        caches.append((cache1, cache2))
    (one1, one2), (al1, al2) = caches
    routed = ids.reshape(-1) >= 0
    assert torch.equal(one1[routed], al1[routed]) and torch.equal(one2[routed], al2[routed])
    assert bool((one1[~routed] == 7).all()) and bool((one2[~routed] == 7).all())
    out = fused_experts_triton(x, w13, w2, weights, ids, MoEGemmConfigs.both(config))
    assert torch.equal(out, moe_sum(al2, ids))


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("count", [1, 2])
def test_one_token_runs_a_dense_shared_mlp_as_its_last_slots(device: str, count: int) -> None:
    """A dense shared-experts MLP (its gate rows then its up rows, `count` experts of the routed experts' width) run
    as one token's last slots reads its own weights: the routed mixture plus the whole shared MLP, as the float64
    definition computes them; a routed slot skipped (-1) still contributes nothing; and shapes, formats or a batch
    the slots cannot run are refused."""
    from sglang.srt.layers.moe.weight_format import SharedMLPWeights

    num_experts, hidden, inter, top_k = 6, 160, 128, 3
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    method = get_moe_method("BF16")
    w1, w3, w2 = _random_experts(num_experts, hidden, inter, seed=41)
    layer = _loaded_layer(method, w1, w3, w2, dtype, device)
    w13, w2_gemm = method.gemm_weights(layer)
    s1, s3, s2 = _random_experts(count, hidden, inter, seed=42)  # the shared MLP as `count` experts
    gate_up = torch.cat([torch.cat(list(s1)), torch.cat(list(s3))])  # [gate of every one; up of every one]
    down = torch.cat(list(s2), dim=1)
    shared = SharedMLPWeights(gate_up.to(device, dtype), down.to(device, dtype), count)
    x = torch.randn(1, hidden, generator=torch.Generator().manual_seed(43))
    weights, ids = _routing(1, num_experts, top_k, seed=44)
    ids[0, 1] = -1
    all_ids = torch.cat([ids, torch.arange(num_experts, num_experts + count, dtype=ids.dtype)[None]], 1)
    all_weights = torch.cat([weights, torch.ones(1, count)], 1)
    out = fused_experts_triton(
        x.to(device, dtype), w13, w2_gemm, all_weights.to(device), all_ids.to(device), shared=shared
    ).cpu()
    ref = _dense_reference(
        x, torch.cat([w1, s1]), torch.cat([w3, s3]), torch.cat([w2, s2]), all_weights, all_ids
    )  # the shared experts as experts num_experts.. of the definition
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(out.double(), ref, **tol)
    without = fused_experts_triton(x.to(device, dtype), w13, w2_gemm, weights.to(device), ids.to(device)).cpu()
    assert not torch.allclose(out, without, rtol=1e-3, atol=1e-3)  # the shared MLP is in the sum
    with pytest.raises(ValueError, match="one token"):
        fused_experts_triton(x.repeat(2, 1).to(device, dtype), w13, w2_gemm, all_weights.repeat(2, 1).to(device),
                             all_ids.repeat(2, 1).to(device), shared=shared)  # fmt: skip
    with pytest.raises(ValueError, match="experts of width"):
        wrong = SharedMLPWeights(shared.gate_up[: inter * count], shared.down, count)
        fused_experts_triton(
            x.to(device, dtype), w13, w2_gemm, all_weights.to(device), all_ids.to(device), shared=wrong
        )


def test_aligned_routing_refuses_two_block_ms() -> None:
    """Aligned routing pads each expert's run to one BLOCK_M both GEMMs read: two different ones are refused
    (before any kernel runs); one token has no alignment, so its GEMMs may differ in BLOCK_M."""
    method = get_moe_method("BF16")
    layer = _loaded_layer(method, *_random_experts(4, 64, 64, seed=31), torch.float32, "cpu")
    w13, w2 = method.gemm_weights(layer)
    weights, ids = _routing(3, 4, 2, seed=32)
    configs = MoEGemmConfigs(MoEKernelConfig(16, 64, 64), MoEKernelConfig(32, 64, 64))
    with pytest.raises(ValueError, match="one BLOCK_M"):
        fused_experts_triton(torch.randn(3, 64), w13, w2, weights, ids, configs)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_moe_layer_forward(device: str) -> None:
    num_experts, hidden, inter, top_k = 8, 64, 64, 2
    w1, w3, w2 = _random_experts(num_experts, hidden, inter, seed=12)
    with torch.device(device):
        layer = FusedMoE(num_experts, top_k, hidden, inter, torch.float32, quant_method="bf16", prefix="mlp.experts")
    assert layer.quant_method.name == "BF16"
    assert layer.w13_weight.shape == (num_experts, 2 * inter, hidden) and layer.w13_weight.device.type == device

    mapping = FusedMoE.make_expert_params_mapping(num_experts)
    assert len(mapping) == 3 * num_experts
    assert ("experts.w13_", "experts.3.gate_proj.", 3, "w1") in mapping
    source = {"gate_proj": w1, "up_proj": w3, "down_proj": w2}
    for param_prefix, ckpt_fragment, expert, shard in mapping:
        proj = ckpt_fragment.split(".")[2]
        layer.weight_loader(param_prefix + "weight", source[proj][expert], shard, expert)

    x = torch.randn(10, hidden, generator=torch.Generator().manual_seed(13))
    logits = torch.randn(10, num_experts, generator=torch.Generator().manual_seed(14))
    out = layer(x.to(device), logits.to(device)).cpu()
    weights, ids = select_experts(logits, top_k, renormalize=True)
    ref = _dense_reference(x, w1, w3, w2, weights, ids)
    # fp32 activations: ieee dot in the triton kernel on CUDA, fp32 matmuls on CPU.
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


def test_fused_moe_layer_on_meta_device() -> None:
    with torch.device("meta"):
        layer = FusedMoE(128, 8, 2048, 768, torch.bfloat16, quant_method="FP8")
    assert all(p.device.type == "meta" and not p.requires_grad for p in layer.parameters())
    # Qwen3-30B-A3B layer: fp8 weights + 128x128 fp32 scales.
    expected = 128 * (1536 * 2048 + 2048 * 768) + 128 * (12 * 16 + 16 * 6) * 4
    assert sum(p.nbytes for p in layer.parameters()) == expected
