"""Linear layers holding a native FP8 checkpoint's format (the GPU's dense layers): the loaders place the
checkpoint's e4m3 codes and scales as they are, merged (q/k/v, gate/up) and split over tensor-parallel ranks,
block scales cut in whole 128-row/column blocks; a shard that would cut a block is refused."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

import pytest
import torch

import sglang.srt.layers.linear as linear
from sglang.srt.layers.quantization.fp8 import Fp8FusedMoEMethod
from sglang.srt.layers.quantization.fp8_linear import quantize_rows

BLOCK = Fp8FusedMoEMethod()


def ranks(monkeypatch, rank: int, size: int) -> None:
    monkeypatch.setattr(linear, "get_tensor_model_parallel_rank", lambda: rank)
    monkeypatch.setattr(linear, "get_tensor_model_parallel_world_size", lambda: size)


def checkpoint(rows: int, cols: int, strategy: str, seed: int):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    return BLOCK.quantize(w) if strategy == "block" else quantize_rows(w)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype == torch.float8_e4m3fn else torch.equal(a, b)
    )


@pytest.mark.parametrize("strategy", ["block", "channel"])
@pytest.mark.parametrize("tp", [1, 2])
def test_merged_and_row_parallel_layers_take_the_checkpoint_as_it_is(strategy, tp, monkeypatch):
    fmt, scale_name = ("fp8_block", "weight_scale_inv") if strategy == "block" else ("fp8_channel", "weight_scale")
    hidden, head, heads, kv_heads, inter = 256, 128, 4, 2, 512
    q, k, v = (checkpoint(n * head, hidden, strategy, s) for s, n in ((1, heads), (2, kv_heads), (3, kv_heads)))
    gate, up = checkpoint(inter, hidden, strategy, 4), checkpoint(inter, hidden, strategy, 5)
    down = checkpoint(hidden, inter, strategy, 6)
    b = 128 if strategy == "block" else 1  # rows per scale row
    for rank in range(tp):
        ranks(monkeypatch, rank, tp)
        qkv = linear.QKVParallelLinear(hidden, head, heads, kv_heads, params_dtype=torch.float32, quantization=fmt)
        gate_up = linear.MergedColumnParallelLinear(hidden, [inter] * 2, params_dtype=torch.float32, quantization=fmt)
        row = linear.RowParallelLinear(inter, hidden, params_dtype=torch.float32, quantization=fmt)
        for layer, parts in ((qkv, zip("qkv", (q, k, v))), (gate_up, zip((0, 1), (gate, up)))):
            for shard, (codes, scale) in parts:
                layer.weight_loader(layer.weight, codes, shard)
                layer.weight_loader(getattr(layer, scale_name), scale, shard)
        row.weight_loader(row.weight, down[0])
        row.weight_loader(getattr(row, scale_name), down[1])

        qh, kvh = heads // tp, kv_heads // tp
        q_rows = slice(rank * qh * head, (rank + 1) * qh * head)
        kv_rows = slice(rank * kvh * head, (rank + 1) * kvh * head)
        want = [q[0][q_rows], k[0][kv_rows], v[0][kv_rows]]
        want_s = [s[1][r.start // b : r.stop // b] for s, r in ((q, q_rows), (k, kv_rows), (v, kv_rows))]
        assert same(qkv.weight, torch.cat(want)) and same(getattr(qkv, scale_name), torch.cat(want_s))
        i_rows = slice(rank * inter // tp, (rank + 1) * inter // tp)
        assert same(gate_up.weight, torch.cat([gate[0][i_rows], up[0][i_rows]]))
        sr = slice(i_rows.start // b, i_rows.stop // b)
        assert same(getattr(gate_up, scale_name), torch.cat([gate[1][sr], up[1][sr]]))
        assert same(row.weight, down[0][:, i_rows])
        want_row_scale = down[1][:, i_rows.start // 128 : i_rows.stop // 128] if strategy == "block" else down[1]
        assert same(getattr(row, scale_name), want_row_scale)


def test_a_shard_cutting_a_scale_block_is_refused(monkeypatch):
    ranks(monkeypatch, 1, 2)
    gate_up = linear.MergedColumnParallelLinear(128, [192, 192], params_dtype=torch.float32, quantization="fp8_block")
    codes, scale = checkpoint(192, 128, "block", 7)  # rank 1's half of 192 rows starts at row 96
    with pytest.raises(ValueError, match="does not fall on the checkpoint's 128x128 scale blocks"):
        gate_up.weight_loader(gate_up.weight_scale_inv, scale, 0)


def test_per_tensor_scale_is_repeated_over_the_rows():
    layer = linear.QKVParallelLinear(128, 64, 2, 1, params_dtype=torch.float32, quantization="fp8_channel")
    for i, shard in enumerate("qkv"):
        rows = 128 if shard == "q" else 64
        layer.weight_loader(layer.weight_scale, torch.tensor([0.5 + i]), shard)
        layer.weight_loader(layer.weight, torch.zeros(rows, 128).to(torch.float8_e4m3fn), shard)
    assert layer.weight_scale.view(-1).tolist() == [0.5] * 128 + [1.5] * 64 + [2.5] * 64


def test_full_precision_weight_into_a_checkpoint_fp8_layer_is_refused():
    layer = linear.ReplicatedLinear(128, 128, params_dtype=torch.float32, quantization="fp8_block")
    with pytest.raises(ValueError, match="takes the checkpoint's float8_e4m3fn weight"):
        layer.weight_loader(layer.weight, torch.randn(128, 128))
