"""KV cache scales beside a checkpoint's weights: which tensor names they have, what shapes are accepted, and
where they go (model_loader/kv_scales.py). The engine-level check is test/registered/models/test_kv_cache_scales.py."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

import logging

import pytest
import torch
from torch import nn

from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.model_loader.kv_scales import KVScaleCollector, apply_kv_scales, kv_scale_target


def test_scale_names_of_the_checkpoint_formats():
    assert kv_scale_target("model.layers.3.self_attn.k_scale") == ("model.layers.3.self_attn", "k")
    assert kv_scale_target("model.layers.3.self_attn.v_scale") == ("model.layers.3.self_attn", "v")
    assert kv_scale_target("model.layers.0.self_attn.k_proj.output_scale") == ("model.layers.0.self_attn", "k")
    assert kv_scale_target("model.layers.0.self_attn.v_proj.output_scale") == ("model.layers.0.self_attn", "v")
    assert kv_scale_target("model.layers.0.self_attn.kv_scale") == ("model.layers.0.self_attn", "kv")
    for other in (
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.k_proj.weight_scale",
        "model.layers.0.self_attn.k_proj.input_scale",
        "model.layers.0.mlp.down_proj.output_scale",
    ):
        assert kv_scale_target(other) is None


def test_collector_takes_the_scales_out_of_the_stream():
    collector = KVScaleCollector()
    weights = [
        ("model.layers.0.self_attn.k_scale", torch.tensor(0.5)),
        ("model.layers.0.self_attn.q_proj.weight", torch.ones(2, 2)),
        ("model.layers.0.self_attn.v_scale", torch.tensor([0.25])),
        ("model.layers.1.self_attn.kv_scale", torch.tensor(2.0)),
    ]
    assert [n for n, _ in collector.weights(weights)] == ["model.layers.0.self_attn.q_proj.weight"]
    assert collector.scales == {
        "model.layers.0.self_attn": {"k": 0.5, "v": 0.25},
        "model.layers.1.self_attn": {"k": 2.0, "v": 2.0},
    }


@pytest.mark.parametrize(
    "tensor,named",
    [(torch.ones(4), r"shape \(4,\)"), (torch.tensor(0.0), "not a positive"), (torch.tensor(float("nan")), "not a")],
)
def test_only_positive_per_tensor_scales(tensor, named):
    with pytest.raises(ValueError, match=named) as e:
        list(KVScaleCollector().weights([("model.layers.2.self_attn.k_scale", tensor)]))
    assert "model.layers.2.self_attn.k_scale" in str(e.value)


class _Attn(nn.Module):
    def __init__(self, layer_id: int) -> None:
        super().__init__()
        self.attn = RadixAttention(2, 8, 0.3, 1, layer_id)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleDict({"self_attn": _Attn(i)}) for i in range(2)])


def test_apply_with_an_fp8_cache_and_ignored_otherwise(caplog):
    scales = {"layers.0.self_attn": {"k": 0.5, "v": 0.25}, "layers.1.self_attn": {"k": 3.0}}
    model = _Model()
    with caplog.at_level(logging.INFO, logger="sglang.srt.model_loader.kv_scales"):
        assert apply_kv_scales(model, scales, torch.bfloat16, mla=False) == 0
    assert sum("are ignored" in r.getMessage() for r in caplog.records) == 1
    assert all(layer["self_attn"].attn.k_scale is None for layer in model.layers)

    assert apply_kv_scales(model, scales, torch.float8_e4m3fn, mla=False) == 2
    attn = [layer["self_attn"].attn for layer in model.layers]
    assert [(a.k_scale, a.v_scale) for a in attn] == [(0.5, 0.25), (3.0, 3.0)]  # a missing one: the other's

    with pytest.raises(ValueError, match="layers.7.self_attn"):
        apply_kv_scales(_Model(), {"layers.7.self_attn": {"k": 1.0}}, torch.float8_e4m3fn, mla=False)
    with pytest.raises(ValueError, match="multi-head latent attention"):
        apply_kv_scales(_Model(), scales, torch.float8_e4m3fn, mla=True)
