from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# --kt-method FP8 straight from a native block-FP8 checkpoint (tiny Qwen3-MoE, transformers-written, quantized
# per 128x128 block), and --kt-method FP8_PERCHANNEL from a compressed-tensors one (a scale per output row, the
# layout KTransformers' FP8_PERCHANNEL reads; or one per tensor): the GPU-side experts and the CPU backend's experts
# hold the checkpoint's own e4m3 codes and scales (no BF16 round trip, no re-quantization), and greedy tokens equal
# transformers on the dequantized weights. The fp8 method of the other scale layout is refused at start-up.

import random

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import moe_bf16, write_fp8_checkpoint
from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def fp8_moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("kt-fp8")
    d = write_fp8_checkpoint(moe_bf16(str(root / "bf16")), str(root / "fp8"), "block")
    rng = random.Random(4)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (3, 20)]
    return d, prompts, hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)


@pytest.mark.parametrize("num_gpu_experts", [0, 1])
def test_kt_fp8_uses_the_checkpoints_experts(fp8_moe, num_gpu_experts):
    d, prompts, ref = fp8_moe
    sched = make_scheduler(
        reuse_model=False,
        model_path=d,
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        kt_method="FP8",
        kt_num_gpu_experts=num_gpu_experts,
    )
    wrapper = sched.model_runner.model.model.layers[0].mlp.experts
    ckpt = load_file(f"{d}/model.safetensors")
    e = "model.layers.0.mlp.experts.3."  # a CPU expert (index 3 - num_gpu_experts in the CPU layer)
    cpu, idx = wrapper.expert_home(3)
    assert cpu is wrapper.cpu_layer and cpu.w13_weight.dtype == torch.float8_e4m3fn
    gate_up = torch.cat([ckpt[e + "gate_proj.weight"], ckpt[e + "up_proj.weight"]])
    assert torch.equal(cpu.w13_weight[idx].view(torch.uint8), gate_up.view(torch.uint8))
    assert torch.equal(cpu.w2_weight_scale_inv[idx], ckpt[e + "down_proj.weight_scale_inv"])
    if num_gpu_experts:
        gpu = wrapper.gpu_experts
        gate_up0 = torch.cat(
            [ckpt["model.layers.0.mlp.experts.0.gate_proj.weight"], ckpt["model.layers.0.mlp.experts.0.up_proj.weight"]]
        )
        assert torch.equal(gpu.w13_weight[0].view(torch.uint8), gate_up0.view(torch.uint8))
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref


def test_other_kt_methods_take_the_dequantized_experts(fp8_moe):
    """--kt-method INT8 on an FP8 checkpoint: the experts arrive dequantized and are quantized to INT8 (a
    different format cannot hold fp8 codes); the model loads and runs."""
    d, prompts, _ = fp8_moe
    sched = make_scheduler(
        reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, kt_method="INT8",
        kt_num_gpu_experts=1,
    )  # fmt: skip
    assert sched.model_runner.model.model.layers[0].mlp.experts.cpu_layer.w13_weight.dtype == torch.int8
    assert len(run_scheduler(sched, prompts[:1], greedy_params(4))[0].output_ids) == 4


def _experts_from_weight_path(d: str, kt_method: str):
    """The model from the checkpoint's dequantized full-precision twin, its routed experts from --kt-weight-path d."""
    return make_scheduler(
        reuse_model=False,
        model_path=d + "-dequantized",
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        kt_method=kt_method,
        kt_num_gpu_experts=1,
        kt_weight_path=d,
    )


def test_kt_weight_path_may_be_an_fp8_checkpoint(fp8_moe):
    """--kt-weight-path at the FP8 checkpoint, the model from its dequantized full-precision twin: the experts
    (GPU and CPU) still hold the FP8 checkpoint's own codes and scales, and the tokens are transformers'."""
    d, prompts, ref = fp8_moe
    sched = _experts_from_weight_path(d, "FP8")
    cpu, idx = sched.model_runner.model.model.layers[1].mlp.experts.expert_home(2)
    ckpt = load_file(f"{d}/model.safetensors")
    assert torch.equal(
        cpu.w2_weight[idx].view(torch.uint8), ckpt["model.layers.1.mlp.experts.2.down_proj.weight"].view(torch.uint8)
    )
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref


@pytest.fixture(scope="module", params=["channel", "tensor"])
def row_scaled_fp8_moe(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"kt-fp8-{request.param}")
    d = write_fp8_checkpoint(moe_bf16(str(root / "bf16")), str(root / "fp8"), request.param)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (4, 17)]
    return d, request.param, prompts, hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)


def test_kt_fp8_perchannel_uses_the_checkpoints_experts(row_scaled_fp8_moe):
    """One GPU-side expert, three on the CPU: both hold the checkpoint's codes, and its row scales (a per-tensor
    checkpoint's one scale on every row); the CPU kernel reads them as they are."""
    d, strategy, prompts, ref = row_scaled_fp8_moe
    sched = make_scheduler(
        reuse_model=False,
        model_path=d,
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        kt_method="FP8_PERCHANNEL",
        kt_num_gpu_experts=1,
    )
    wrapper = sched.model_runner.model.model.layers[1].mlp.experts
    ckpt = load_file(f"{d}/model.safetensors")
    e = "model.layers.1.mlp.experts.2."
    cpu, idx = wrapper.expert_home(2)
    assert cpu is wrapper.cpu_layer and cpu.quant_method.name == "FP8_PERCHANNEL"
    gate_up = torch.cat([ckpt[e + "gate_proj.weight"], ckpt[e + "up_proj.weight"]])
    assert torch.equal(cpu.w13_weight[idx].view(torch.uint8), gate_up.view(torch.uint8))
    down_scale = ckpt[e + "down_proj.weight_scale"].reshape(-1)
    rows = cpu.w2_weight_scale.shape[1]
    assert torch.equal(cpu.w2_weight_scale[idx], down_scale.expand(rows) if strategy == "tensor" else down_scale)
    gpu = wrapper.gpu_experts
    assert gpu.quant_method.name == "FP8_PERCHANNEL"
    up0 = ckpt["model.layers.1.mlp.experts.0.up_proj.weight"]
    assert torch.equal(gpu.w13_weight[0, up0.shape[0] :].view(torch.uint8), up0.view(torch.uint8))
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref


def test_fp8_method_of_the_other_scale_layout_is_refused(fp8_moe, row_scaled_fp8_moe):
    """--kt-method FP8 would re-quantize a per-channel checkpoint's experts into 128x128 blocks, FP8_PERCHANNEL a
    block one's into rows: each is a start-up error naming the method that holds them, before any weight is read."""
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.configs.errors import ServerArgsError
    from sglang.srt.server_args import ServerArgs

    def resolve(model_path: str, method: str):
        args = ServerArgs(model_path=model_path, device="cpu", kt_method=method, kt_num_gpu_experts=1)
        return resolve_engine_config(args)

    row_scaled, strategy, _, _ = row_scaled_fp8_moe
    with pytest.raises(ServerArgsError, match=f"--kt-method FP8: .*per-{strategy} scales .*--kt-method FP8_PERCHANNEL"):
        resolve(row_scaled, "FP8")
    with pytest.raises(ServerArgsError, match="--kt-method FP8_PERCHANNEL: .*per-block scales .*--kt-method FP8 runs"):
        resolve(fp8_moe[0], "FP8_PERCHANNEL")
    assert resolve(row_scaled, "FP8_PERCHANNEL").kt.method == "FP8_PERCHANNEL"
    assert resolve(row_scaled, "INT8").kt.method == "INT8"  # another format: the user's choice of re-quantization


def test_kt_weight_path_may_be_a_per_channel_fp8_checkpoint(row_scaled_fp8_moe):
    """--kt-weight-path at the per-channel (or per-tensor) checkpoint, the model from its dequantized twin: the CPU
    experts hold its codes and row scales, and the tokens are transformers'."""
    d, strategy, prompts, ref = row_scaled_fp8_moe
    sched = _experts_from_weight_path(d, "FP8_PERCHANNEL")
    cpu, idx = sched.model_runner.model.model.layers[0].mlp.experts.expert_home(3)
    ckpt = load_file(f"{d}/model.safetensors")
    e = "model.layers.0.mlp.experts.3."
    assert torch.equal(cpu.w2_weight[idx].view(torch.uint8), ckpt[e + "down_proj.weight"].view(torch.uint8))
    up_scale = ckpt[e + "up_proj.weight_scale"].reshape(-1)
    inter = cpu.w13_weight_scale.shape[1] // 2
    assert torch.equal(cpu.w13_weight_scale[idx, inter:], up_scale.expand(inter) if strategy == "tensor" else up_scale)
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref
