"""layers/linear.py: a checkpoint's fused q/k/v and gate/up tensors (Phi-3's qkv_proj, gate_up_proj), taken whole
by the merged layers' loaders (shard id None), fill each tensor-parallel rank exactly as the separate tensors do (and StackedLinear its parts):
weights, biases, and a block-fp8 layer's 128x128 scales; a fused tensor missing rows is refused."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

import pytest
import torch

from sglang.srt.layers import linear
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, StackedLinear
from sglang.srt.layers.quantization.fp8_block_linear import fp8_block_linear


def ranks(monkeypatch, rank: int, size: int) -> None:
    monkeypatch.setattr(linear, "get_tensor_model_parallel_rank", lambda: rank)
    monkeypatch.setattr(linear, "get_tensor_model_parallel_world_size", lambda: size)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fused_qkv_equals_separate_tensors(tp, monkeypatch):
    heads, kv_heads, d, hidden = 8, 2, 16, 64  # tp 4: KV heads replicated over ranks
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n * d, hidden, generator=g) for n in (heads, kv_heads, kv_heads))
    bq, bk, bv = (torch.randn(n * d, generator=g) for n in (heads, kv_heads, kv_heads))
    for rank in range(tp):
        ranks(monkeypatch, rank, tp)
        fused = QKVParallelLinear(hidden, d, heads, kv_heads, bias=True, params_dtype=torch.float32)
        split = QKVParallelLinear(hidden, d, heads, kv_heads, bias=True, params_dtype=torch.float32)
        fused.weight.weight_loader(fused.weight, torch.cat([q, k, v]))
        fused.bias.weight_loader(fused.bias, torch.cat([bq, bk, bv]))
        for shard, w, b in (("q", q, bq), ("k", k, bk), ("v", v, bv)):
            split.weight.weight_loader(split.weight, w, shard)
            split.bias.weight_loader(split.bias, b, shard)
        assert torch.equal(fused.weight, split.weight) and torch.equal(fused.bias, split.bias)
        # and what this rank holds is its heads' rows of q, then of k, then of v
        h = fused.heads
        assert torch.equal(fused.weight[: fused.q_size], q[h.q_start * d : h.q_end * d])
        assert torch.equal(fused.weight[fused.q_size + fused.kv_size :], v[h.kv_start * d : h.kv_end * d])


@pytest.mark.parametrize("tp", [1, 2])
def test_fused_gate_up_equals_separate_tensors(tp, monkeypatch):
    inter, hidden = 96, 32
    g = torch.Generator().manual_seed(1)
    gate, up = torch.randn(inter, hidden, generator=g), torch.randn(inter, hidden, generator=g)
    for rank in range(tp):
        ranks(monkeypatch, rank, tp)
        fused = MergedColumnParallelLinear(hidden, [inter] * 2, params_dtype=torch.float32)
        split = MergedColumnParallelLinear(hidden, [inter] * 2, params_dtype=torch.float32)
        fused.weight.weight_loader(fused.weight, torch.cat([gate, up]))
        split.weight.weight_loader(split.weight, gate, 0)
        split.weight.weight_loader(split.weight, up, 1)
        assert torch.equal(fused.weight, split.weight)
        rows = slice(rank * inter // tp, (rank + 1) * inter // tp)
        assert torch.equal(fused.weight, torch.cat([gate[rows], up[rows]]))


def test_fused_block_fp8_scales_are_cut_by_block(monkeypatch):
    ranks(monkeypatch, 1, 2)
    inter, hidden = 512, 256
    layer = MergedColumnParallelLinear(hidden, [inter] * 2, params_dtype=torch.float32, quantization="fp8_block")
    scales = torch.arange(2 * inter // 128 * hidden // 128, dtype=torch.float32).view(2 * inter // 128, -1)
    layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, scales)
    # rank 1 of 2: the second half of gate's blocks (rows 2, 3), then of up's (rows 6, 7)
    assert torch.equal(layer.weight_scale_inv, scales[[2, 3, 6, 7]])


def test_fused_tensor_missing_rows_is_refused():
    layer = QKVParallelLinear(64, 16, 4, 2, params_dtype=torch.float32)
    with pytest.raises(ValueError, match="fused checkpoint tensor of 96 rows for a layer of 128"):
        layer.weight.weight_loader(layer.weight, torch.zeros(96, 64))


@pytest.mark.parametrize("tp", [1, 2])
def test_stacked_head_split_and_replicated_parts(tp, monkeypatch):
    """MLA's q_proj (this rank's heads) and kv_a_proj_with_mqa (every rank all of it) in one StackedLinear: the
    rows each rank holds, a block-fp8 layer's scales after them, and a tensor with the wrong rows refused."""
    heads, head, kv_a, hidden = 4, 192, 576, 256
    g = torch.Generator().manual_seed(2)
    q, kv = torch.randn(heads * head, hidden, generator=g), torch.randn(kv_a, hidden, generator=g)
    for rank in range(tp):
        mine = heads // tp
        parts = {"q": (heads * head, rank * mine * head, mine * head), "kv_a": (kv_a, 0, kv_a)}
        layer = StackedLinear(hidden, parts, params_dtype=torch.float32)
        for shard, w in (("kv_a", kv), ("q", q)):  # any order
            layer.weight.weight_loader(layer.weight, w, shard)
        assert layer.part_sizes == [mine * head, kv_a]
        assert torch.equal(layer.weight, torch.cat([q[rank * mine * head : (rank + 1) * mine * head], kv]))
        x = torch.randn(3, hidden, generator=g)
        q_out, kv_out = layer(x)
        assert torch.allclose(kv_out, x @ kv.T, atol=1e-5)

        block = StackedLinear(hidden, parts, params_dtype=torch.float32, quantization="fp8_block")
        q_scales = torch.arange(heads * head // 128 * 2, dtype=torch.float32).view(-1, 2)
        kv_scales = -torch.arange(5 * 2, dtype=torch.float32).view(5, 2)  # 576 rows: 4.5 blocks
        block.weight_scale_inv.weight_loader(block.weight_scale_inv, q_scales, "q")
        block.weight_scale_inv.weight_loader(block.weight_scale_inv, kv_scales, "kv_a")
        mine_blocks = mine * head // 128
        expected = torch.cat([q_scales[rank * mine_blocks : (rank + 1) * mine_blocks], kv_scales])
        assert torch.equal(block.weight_scale_inv[: len(expected)], expected)
        # whole 128-row blocks for cuBLAS's block-scaled GEMM: padding rows after the parts, their columns dropped
        rows = mine * head + kv_a
        assert block.weight.shape[0] == -(-rows // 128) * 128 > rows
        for shard, w in (("q", q), ("kv_a", kv)):
            block.weight.weight_loader(block.weight, w.to(torch.float8_e4m3fn), shard)
        q_out, kv_out = block(x)
        assert q_out.shape == (3, mine * head) and kv_out.shape == (3, kv_a) and kv_out.isfinite().all()
        assert (block.weight[rows:].float() == 0).all()  # the padding rows: zeros, never loaded
        ref = fp8_block_linear(x, kv.to(torch.float8_e4m3fn), kv_scales, None)
        assert torch.allclose(kv_out, ref, rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="part 'kv_a' has 512 rows, expected 576"):
        layer.weight.weight_loader(layer.weight, torch.zeros(512, hidden), "kv_a")
    with pytest.raises(ValueError, match="parts are \\['q', 'kv_a'\\]"):
        layer.weight.weight_loader(layer.weight, kv, "k")


def test_stacked_block_fp8_parts_start_on_scale_blocks():
    """A block-fp8 part that does not end on a 128-row block (a q_lora_rank or a rank's heads not a multiple of 128)
    leaves zero rows up to the next block, where the next part starts: each part's scale blocks stay its own."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(100, 256, generator=g), torch.randn(60, 256, generator=g)
    layer = StackedLinear(256, {"a": (100, 0, 100), "b": (60, 0, 60)}, params_dtype=torch.float32,
                          quantization="fp8_block")  # fmt: skip
    assert layer.part_starts == {"a": 0, "b": 128} and layer.weight.shape == (256, 256)
    scales = {"a": torch.tensor([[0.5, 2.0]]), "b": torch.tensor([[4.0, 0.25]])}
    for shard, w in (("a", a), ("b", b)):
        layer.weight.weight_loader(layer.weight, w.to(torch.float8_e4m3fn), shard)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, scales[shard], shard)
    assert torch.equal(layer.weight_scale_inv, torch.cat([scales["a"], scales["b"]]))
    assert (layer.weight[100:128].float() == 0).all() and (layer.weight[188:].float() == 0).all()
    x = torch.randn(2, 256, generator=g)
    out_a, out_b = layer(x)
    assert out_a.shape == (2, 100) and out_b.shape == (2, 60)
    for out, w, shard in ((out_a, a, "a"), (out_b, b, "b")):
        ref = fp8_block_linear(x, w.to(torch.float8_e4m3fn), scales[shard], None)
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-3), shard
