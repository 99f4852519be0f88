"""layers/linear.py's store_weights_column_major (what the CPU loader runs after loading): each full-precision
linear weight keeps its [N, K] values with strides (1, N); the layer's output is the same within float rounding (the
same bits from 4 rows up, where torch's CPU GEMM runs one kernel for both layouts); fp8 layers and the other
parameters (embeddings, norms) keep their layout; a weight loader still fills the re-laid-out weight."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

import torch
from torch import nn

from sglang.srt.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, store_weights_column_major


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.gate_up = MergedColumnParallelLinear(32, [48] * 2, params_dtype=torch.float32)
        self.down = ReplicatedLinear(48, 32, bias=True, params_dtype=torch.float32)
        self.fp8 = ReplicatedLinear(32, 16, params_dtype=torch.float32, quantization="fp8")


def test_full_precision_linears_become_column_major_with_the_same_values():
    torch.manual_seed(0)
    model = Tiny()
    gate, up = torch.randn(48, 32), torch.randn(48, 32)
    model.gate_up.weight.weight_loader(model.gate_up.weight, torch.cat([gate, up]))
    model.down.weight.weight_loader(model.down.weight, torch.randn(32, 48))
    model.down.bias.weight_loader(model.down.bias, torch.randn(32))
    model.fp8.weight.weight_loader(model.fp8.weight, torch.randn(16, 32))  # quantized as it loads
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    x = torch.randn(8, 48)
    y_before = model.down(x)

    assert store_weights_column_major(model) == 2
    for layer in (model.gate_up, model.down):
        assert layer.weight.stride() == (1, layer.weight.shape[0])
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    assert model.embed.weight.is_contiguous() and model.fp8.weight.is_contiguous()
    assert model.fp8.weight.dtype == torch.float8_e4m3fn  # fp8 layers are left alone
    assert torch.equal(model.down(x), y_before)  # 8 rows: the same kernel, the same bits
    assert torch.allclose(model.down(x[:1]), y_before[:1], rtol=1e-5, atol=1e-5)

    # A later load (the same loader) writes through the new layout.
    new_up = torch.randn(48, 32)
    model.gate_up.weight.weight_loader(model.gate_up.weight, new_up, 1)
    assert torch.equal(model.gate_up.weight[48:], new_up) and torch.equal(model.gate_up.weight[:48], gate)
    assert model.gate_up.weight.stride() == (1, 96)
