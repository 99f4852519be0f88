from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")
register_cuda_ci(est_time=60, suite="per-commit-cuda")

# MoE weight methods: registry, parameter layouts, quantize/dequantize accuracy, expert copies.
# Each quantized format is checked against a reference quantizer written here, block by block.

import math

import pytest
import torch

from sglang.srt.layers.quantization import MOE_METHODS, get_moe_method
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase

CUDA_SKIP = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the GPU machine)")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA_SKIP)]
METHODS = list(MOE_METHODS)
E, H, I = 3, 256, 128  # noqa: E741 - small, but H spans two FP8 blocks / INT4 groups


def _expected_layouts(name: str, e: int, h: int, i: int, dtype: torch.dtype) -> dict:
    """The documented parameter layout of each method."""
    c = lambda a, b: -(-a // b)  # noqa: E731
    f32, u8 = torch.float32, torch.uint8
    return {
        "BF16": {"w13_weight": ((e, 2 * i, h), dtype), "w2_weight": ((e, h, i), dtype)},
        "FP8": {
            "w13_weight": ((e, 2 * i, h), torch.float8_e4m3fn),
            "w13_weight_scale_inv": ((e, c(2 * i, 128), c(h, 128)), f32),
            "w2_weight": ((e, h, i), torch.float8_e4m3fn),
            "w2_weight_scale_inv": ((e, c(h, 128), c(i, 128)), f32),
        },
        "FP8_PERCHANNEL": {
            "w13_weight": ((e, 2 * i, h), torch.float8_e4m3fn),
            "w13_weight_scale": ((e, 2 * i), f32),
            "w2_weight": ((e, h, i), torch.float8_e4m3fn),
            "w2_weight_scale": ((e, h), f32),
        },
        "INT8": {
            "w13_weight": ((e, 2 * i, h), torch.int8),
            "w13_weight_scale": ((e, 2 * i), f32),
            "w2_weight": ((e, h, i), torch.int8),
            "w2_weight_scale": ((e, h), f32),
        },
        "INT4": {
            "w13_weight": ((e, 2 * i, h // 2), u8),
            "w13_weight_scale": ((e, 2 * i, c(h, 128)), f32),
            "w2_weight": ((e, h, i // 2), u8),
            "w2_weight_scale": ((e, h, c(i, 128)), f32),
        },
        "MXFP4": {
            "w13_weight": ((e, 2 * i, h // 2), u8),
            "w13_weight_scale": ((e, 2 * i, c(h, 32)), u8),
            "w2_weight": ((e, h, i // 2), u8),
            "w2_weight_scale": ((e, h, c(i, 32)), u8),
        },
    }[name]


def _layer(method: FusedMoEMethodBase, device: str, e: int = E, h: int = H, i: int = I, dtype=torch.float32):
    layer = torch.nn.Module()
    with torch.device(device):
        method.create_weights(layer, e, h, i, dtype)
    return layer


def _weights(seed: int, h: int = H, i: int = I) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = {
        "w1": torch.randn(i, h, generator=g),
        "w3": torch.randn(i, h, generator=g),
        "w2": torch.randn(h, i, generator=g),
    }
    w["w1"][5, 17] = 9.0  # one outlier: block/group scales must keep it and the error bounds stay per-block
    return {k: v * 0.02 for k, v in w.items()}


def _load(method: FusedMoEMethodBase, layer, expert: int, w: dict[str, torch.Tensor]) -> None:
    for shard, weight in w.items():
        method.load_expert(layer, expert, shard, weight)


# ---------------------------------------------------------------- reference quantizers (dequantized)


def _ref_fp8(w: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(w)
    for r in range(0, w.shape[0], 128):
        for c in range(0, w.shape[1], 128):
            blk = w[r : r + 128, c : c + 128]
            scale = blk.abs().max() / 448.0
            out[r : r + 128, c : c + 128] = (blk / scale).to(torch.float8_e4m3fn).float() * scale
    return out


def _ref_fp8_rows(w: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(w)
    for r in range(w.shape[0]):
        scale = w[r].abs().max() / 448.0
        out[r] = (w[r] / scale).to(torch.float8_e4m3fn).float() * scale
    return out


def _ref_int8(w: torch.Tensor) -> torch.Tensor:
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    return torch.round(w / scale).clamp(-127, 127) * scale


def _ref_int4(w: torch.Tensor, group: int = 128) -> torch.Tensor:
    out = torch.empty_like(w)
    for c in range(0, w.shape[1], group):
        g = w[:, c : c + group]
        scale = g.abs().amax(dim=1, keepdim=True) / 7
        out[:, c : c + group] = torch.round(g / scale).clamp(-8, 7) * scale
    return out


def _ref_mxfp4(w: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    out = torch.empty_like(w)
    for c in range(0, w.shape[1], 32):
        g = w[:, c : c + 32]
        for r in range(w.shape[0]):
            amax = g[r].abs().max().item()
            scale = 2.0 ** math.ceil(math.log2(amax / 6.0))  # smallest power of two that fits amax in 6
            nearest = grid[(g[r].abs()[:, None] / scale - grid).abs().argmin(dim=1)]
            out[r, c : c + 32] = torch.sign(g[r]) * nearest * scale
    return out


REFERENCES = {
    "BF16": lambda w: w,
    "FP8": _ref_fp8,
    "FP8_PERCHANNEL": _ref_fp8_rows,
    "INT8": _ref_int8,
    "INT4": _ref_int4,
    "MXFP4": _ref_mxfp4,
}


def _error_bound(name: str, w: torch.Tensor) -> torch.Tensor:
    """Elementwise worst-case |dequant - w| from each format's rounding step."""
    a = w.abs()
    if name == "BF16":
        return torch.zeros_like(w)
    if name == "FP8":  # 3 mantissa bits: half-ulp 2**-4 relative; subnormal step 2**-9 * scale
        blk_scale = _ref_fp8_scale(w)
        return 2.0**-4 * a + 2.0**-10 * blk_scale + 1e-12
    if name == "FP8_PERCHANNEL":
        return 2.0**-4 * a + 2.0**-10 * a.amax(dim=1, keepdim=True) / 448 + 1e-12
    if name == "INT8":
        return (a.amax(dim=1, keepdim=True) / 127 / 2).expand_as(w) * (1 + 1e-5)
    if name == "INT4":
        s = a.view(w.shape[0], -1, 128).amax(-1) / 7
        return s.repeat_interleave(128, dim=1) / 2 * (1 + 1e-5)
    # MXFP4: 1 mantissa bit: half-ulp 1/4 relative, subnormal step 0.5 * scale.
    scale = torch.exp2(torch.ceil(torch.log2(a.view(w.shape[0], -1, 32).amax(-1) / 6)))
    return 0.25 * a + 0.25 * scale.repeat_interleave(32, dim=1) + 1e-12


def _ref_fp8_scale(w: torch.Tensor) -> torch.Tensor:
    s = w.abs().view(w.shape[0] // 128, 128, w.shape[1] // 128, 128).amax(dim=(1, 3)) / 448
    return s.repeat_interleave(128, 0).repeat_interleave(128, 1)


# ---------------------------------------------------------------- tests


def test_registry_names_and_aliases() -> None:
    assert set(MOE_METHODS) == {"BF16", "FP8", "FP8_PERCHANNEL", "INT8", "INT4", "MXFP4"}
    assert get_moe_method("fp8").name == "FP8"
    assert get_moe_method("fp8_perchannel").name == "FP8_PERCHANNEL"
    assert get_moe_method("Mxfp4").name == "MXFP4"
    assert get_moe_method("AMXINT4").name == "INT4"
    assert get_moe_method("amxint8").name == "INT8"
    assert get_moe_method("RAWINT4").name == "INT4"
    assert (
        get_moe_method("int4_g32").name == "INT4" and get_moe_method("INT4_G32").group == 32
    )  # INT4 in a checkpoint's groups
    assert get_moe_method("bf16") is not get_moe_method("bf16")  # fresh instance each time
    with pytest.raises(ValueError, match="BF16.*FP8.*FP8_PERCHANNEL.*INT8.*INT4.*MXFP4"):
        get_moe_method("LLAMAFILE")


@pytest.mark.parametrize("name", METHODS)
def test_create_weights_layout_and_meta_bytes(name: str) -> None:
    method = get_moe_method(name)
    cpu = _layer(method, "cpu", dtype=torch.bfloat16)
    expected = _expected_layouts(name, E, H, I, torch.bfloat16)
    params = dict(cpu.named_parameters())
    assert {k: (tuple(p.shape), p.dtype) for k, p in params.items()} == expected
    assert all(not p.requires_grad for p in params.values())

    # Qwen3-30B-A3B sizes on meta: the bytes the lead budgets must equal what a real layer holds.
    for e, h, i in ((E, H, I), (128, 2048, 768)):
        meta = _layer(get_moe_method(name), "meta", e, h, i, torch.bfloat16)
        assert all(p.device.type == "meta" for p in meta.parameters())
        shapes = _expected_layouts(name, e, h, i, torch.bfloat16)
        want = sum(math.prod(s) * torch.empty((), dtype=d).element_size() for s, d in shapes.values())
        assert sum(p.nbytes for p in meta.parameters()) == want
    meta_small = _layer(get_moe_method(name), "meta", dtype=torch.bfloat16)
    assert sum(p.nbytes for p in meta_small.parameters()) == sum(p.numel() * p.element_size() for p in params.values())


@pytest.mark.parametrize("name", METHODS)
def test_quantize_dequantize_matches_reference(name: str) -> None:
    method = get_moe_method(name)
    layer = _layer(method, "cpu")
    w = _weights(seed=1)
    _load(method, layer, 1, w)
    w13, w2 = method.dequantize_expert(layer, 1)
    assert w13.shape == (2 * I, H) and w2.shape == (H, I) and w13.dtype == w2.dtype == torch.float32

    for got, orig in ((w13, torch.cat((w["w1"], w["w3"]))), (w2, w["w2"])):
        ref = REFERENCES[name](orig)
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-9)
        assert bool(((got - orig).abs() <= _error_bound(name, orig)).all())
    rel = ((w13 - torch.cat((w["w1"], w["w3"]))).norm() / torch.cat((w["w1"], w["w3"])).norm()).item()
    max_rel = {"BF16": 0.0, "FP8": 6e-2, "FP8_PERCHANNEL": 6e-2, "INT8": 1e-2, "INT4": 0.2, "MXFP4": 0.2}[name]
    assert rel <= max_rel


def test_bf16_params_keep_dtype() -> None:
    method = get_moe_method("BF16")
    layer = _layer(method, "cpu", dtype=torch.bfloat16)
    w = _weights(seed=2)
    _load(method, layer, 0, w)
    w13, w2 = method.dequantize_expert(layer, 0)
    assert w13.dtype == torch.bfloat16
    assert torch.equal(w2, w["w2"].to(torch.bfloat16))


def test_shape_and_alignment_errors() -> None:
    with pytest.raises(ValueError, match="multiple"):
        _layer(get_moe_method("FP8"), "meta", 2, 256, 192)  # 2I blocks would straddle w1/w3
    with pytest.raises(ValueError, match="even"):
        _layer(get_moe_method("INT4"), "meta", 2, 255, 128)
    method = get_moe_method("INT8")
    layer = _layer(method, "cpu")
    with pytest.raises(ValueError, match="expected shape"):
        method.load_expert(layer, 0, "w1", torch.zeros(H, I))
    with pytest.raises(ValueError, match="shard"):
        method.load_expert(layer, 0, "w4", torch.zeros(I, H))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", METHODS)
def test_copy_expert_from(name: str, device: str) -> None:
    method = get_moe_method(name)
    src = _layer(method, "cpu", e=3)
    for e in range(3):
        _load(method, src, e, _weights(seed=10 + e))
    if device == "cuda":  # the hybrid path: pinned host experts streamed into GPU slots
        for p in src.parameters():
            p.data = p.data.pin_memory()
    dst = _layer(method, device, e=2)
    _load(method, dst, 0, _weights(seed=20))
    _load(method, dst, 1, _weights(seed=21))
    before = method.dequantize_expert(dst, 1)

    method.copy_expert_from(dst, 0, src, 2)
    if device == "cuda":
        torch.cuda.synchronize()
    for got, want in zip(method.dequantize_expert(dst, 0), method.dequantize_expert(src, 2)):
        assert torch.equal(got.cpu(), want)
    for got, want in zip(method.dequantize_expert(dst, 1), before):
        assert torch.equal(got, want)  # the other slot is untouched


def test_fp8_layouts_hold_their_checkpoint_scales() -> None:
    """Which format holds a native FP8 checkpoint's experts as they are, by the checkpoint's scale layout."""
    holds = {
        name: [s for s in ("block", "channel", "tensor") if get_moe_method(name).holds_checkpoint_fp8(s)]
        for name in METHODS
    }
    assert holds == {
        "BF16": [],
        "FP8": ["block"],
        "FP8_PERCHANNEL": ["channel", "tensor"],
        "INT8": [],
        "INT4": [],
        "MXFP4": [],
    }
    from sglang.srt.configs.quantization_config import CheckpointQuantization

    int4 = CheckpointQuantization("compressed-tensors", "group", "weight_scale", "none", (), 32)
    assert [name for name in METHODS if get_moe_method(name).holds_checkpoint(int4)] == []
    assert get_moe_method("INT4_G32").holds_checkpoint(int4)  # the checkpoint's own groups
    block = CheckpointQuantization("fp8", "block", "weight_scale_inv", "dynamic")
    assert [name for name in METHODS if get_moe_method(name).holds_checkpoint(block)] == ["FP8"]


def test_an_fp8_scale_the_format_cannot_hold_is_a_load_error_naming_the_holder() -> None:
    """A checkpoint's fp8 expert scale reaching experts of another format (the --kt-weight-path route) is refused,
    naming the format that holds that layout (checkpoint_fp8_holder, which engine_config's start-up check asks too)."""
    from sglang.srt.layers.moe.layer import load_expert_from_checkpoint, make_moe_layer
    from sglang.srt.layers.quantization import checkpoint_fp8_holder

    holders = [checkpoint_fp8_holder(s) for s in ("block", "channel", "tensor")]
    assert holders == ["FP8", "FP8_PERCHANNEL", "FP8_PERCHANNEL"]
    layer = make_moe_layer(2, 256, 128, torch.float32, "INT8")
    for kind, holder in (("weight_scale_inv", "FP8 can"), ("weight_scale", "FP8_PERCHANNEL can")):
        with pytest.raises(ValueError, match=f"{kind} .*the INT8 expert format cannot hold.*; {holder}"):
            load_expert_from_checkpoint(layer, layer.quant_method, (0, 128), 0, "w2", torch.ones(2, 1), kind)


def test_per_channel_checkpoint_experts_are_copied_as_they_are() -> None:
    """A compressed-tensors expert (e4m3 codes, `weight_scale` [rows, 1]) into FP8_PERCHANNEL, on the second of two
    tensor-parallel ranks (inter_range (64, 128)): w1 / w3 give their rows 64-127 and those rows' scales, w2 its
    columns 64-127 and every row's scale, bytes unchanged; a per-tensor scale becomes every row's. The block
    format refuses per-row scales naming FP8_PERCHANNEL."""
    from sglang.srt.layers.moe.layer import load_expert_from_checkpoint

    method = get_moe_method("FP8_PERCHANNEL")
    layer = _layer(method, "cpu", i=I // 2)
    full = {"w1": (I, H), "w3": (I, H), "w2": (H, I)}
    g = torch.Generator().manual_seed(40)
    ckpt = {}
    for shard, shape in full.items():
        q, scale = method.quantize(torch.randn(shape, generator=g))
        ckpt[shard] = (q, scale.reshape(-1, 1))
        load_expert_from_checkpoint(layer, method, (I // 2, I), 1, shard, q, "weight")
        load_expert_from_checkpoint(layer, method, (I // 2, I), 1, shard, scale.reshape(-1, 1), "weight_scale")
    u8 = lambda t: t.view(torch.uint8)  # noqa: E731
    assert torch.equal(u8(layer.w13_weight[1, : I // 2]), u8(ckpt["w1"][0][I // 2 :]))
    assert torch.equal(u8(layer.w13_weight[1, I // 2 :]), u8(ckpt["w3"][0][I // 2 :]))
    assert torch.equal(layer.w13_weight_scale[1, I // 2 :], ckpt["w3"][1][I // 2 :, 0])
    assert torch.equal(u8(layer.w2_weight[1]), u8(ckpt["w2"][0][:, I // 2 :]))
    assert torch.equal(layer.w2_weight_scale[1], ckpt["w2"][1][:, 0])

    load_expert_from_checkpoint(layer, method, (I // 2, I), 0, "w2", torch.tensor(0.25), "weight_scale")
    assert bool((layer.w2_weight_scale[0] == 0.25).all())

    block = get_moe_method("FP8")
    block_layer = _layer(block, "cpu")
    with pytest.raises(ValueError, match="weight_scale .channel scales.* FP8 expert format .*FP8_PERCHANNEL"):
        load_expert_from_checkpoint(block_layer, block, (0, I), 0, "w2", ckpt["w2"][1], "weight_scale")


def test_checkpoint_experts_method_holds_the_checkpoints_own_experts():
    """Without KT the routed experts take the checkpoint's format: int4 groups on either device, fp8 where the linear
    layers keep it (the GPU); experts the config's ignore list names (either naming of the experts: Mixtral's
    block_sparse_moe / w1 or the others' mlp / gate_proj) and every other checkpoint: full precision."""
    import dataclasses

    from sglang.srt.configs.quantization_config import CheckpointQuantization
    from sglang.srt.layers.quantization import checkpoint_experts_method

    int4 = CheckpointQuantization("compressed-tensors", "group", "weight_scale", "none", (), 32)
    assert checkpoint_experts_method(None, int4, "model.layers.3") == "INT4_G32"
    assert checkpoint_experts_method(None, dataclasses.replace(int4, group_size=128), "model.layers.3") == "INT4"
    for ignored in (r"re:.*mlp\.experts.*", r"re:.*block_sparse_moe\.experts\.\d+\.w1", "model.layers.3.mlp.experts"):
        only_layer_3 = dataclasses.replace(int4, ignored=(ignored,))
        assert checkpoint_experts_method(None, only_layer_3, "model.layers.3") == "BF16", ignored
    assert (
        checkpoint_experts_method(
            None, dataclasses.replace(int4, ignored=("model.layers.3.mlp.experts",)), "model.layers.4"
        )
        == "INT4_G32"
    )
    fp8 = CheckpointQuantization("fp8", "block", "weight_scale_inv", "dynamic")
    assert checkpoint_experts_method("fp8_block", fp8, "model.layers.3") == "FP8"
    assert checkpoint_experts_method("fp8_channel", fp8, "model.layers.3") == "FP8_PERCHANNEL"
    assert checkpoint_experts_method(None, fp8, "model.layers.3") == "BF16"  # the CPU dequantizes fp8 at load
    assert checkpoint_experts_method(None, None, "model.layers.3") == "BF16"
