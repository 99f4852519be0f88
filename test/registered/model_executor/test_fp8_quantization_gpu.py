"""--quantization fp8 on the GPU: fp8 weights with per-row scales in every projection, decode through the skinny
kernel on fp8 operands where the table says so (in CUDA graphs) and torch._scaled_mm elsewhere; graphs equal
eager, the two fp8 GEMMs agree, and the fp8 model tracks the bf16 model on the same weights."""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="per-commit-cuda")

import pytest
import torch

from sglang.test.gpu_utils import (
    REQUIRES_GPU_REASON,
    decode_logits_three_ways,
    extend_batch,
    has_gpu,
    shape_config_dir,
)

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

MODEL = "Llama-1B-random"


def _tile(block_m: int, split_k: int) -> dict:
    return dict(block_m=block_m, block_n=64, block_k=256, num_warps=4, num_stages=4, split_k=split_k, pdl=True)


def _server_args(**kw):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(
        model_path=shape_config_dir(MODEL),
        load_format="dummy",
        skip_tokenizer_init=True,
        max_total_tokens=32768,
        max_running_requests=64,
        cuda_graph_max_bs=48,
        mem_fraction_static=0.3,
        **kw,
    )


def _runner(args, tables: str):
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.model_runner import ModelRunner

    with envs.SGLANG_DECODE_GEMM_CONFIG_DIR.override(tables):
        return ModelRunner(resolve_engine_config(args))


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    from transformers import AutoConfig

    from sglang.srt.layers.decode_gemm.shapes import projection_shapes
    from sglang.srt.layers.decode_gemm.table import device_table_path, shape_key, update_table_file

    tables = str(tmp_path_factory.mktemp("fp8-gemm-tables"))
    device = torch.cuda.get_device_name()
    # fp8 entries only: batches 1..16 one tile, 17..32 split-K; above 32 _scaled_mm.
    entries = {"16": _tile(16, 1), "32": _tile(32, 2)}
    shapes = projection_shapes(AutoConfig.from_pretrained(shape_config_dir(MODEL)))
    update_table_file(
        device_table_path(device, tables),
        device,
        f"{MODEL} tp1",
        {shape_key(n, k, True): entries for n, k in shapes.values()},
    )
    return tables


@pytest.fixture(scope="module")
def runner(tables):
    mr = _runner(_server_args(quantization="fp8"), tables)
    yield mr
    mr.shutdown()


def _linears(mr):
    from sglang.srt.layers.linear import LinearBase

    return [m for m in mr.model.modules() if isinstance(m, LinearBase)]


def test_every_projection_is_fp8_with_the_tables_plan(runner):
    from sglang.srt.layers.quantization.fp8_linear import FP8_DTYPE

    linears = _linears(runner)
    assert len(linears) == 4 * runner.model_config.num_hidden_layers
    for m in linears:
        assert m.weight.dtype == FP8_DTYPE and m.weight.is_cuda and m.weight_scale.dtype == torch.float32
        assert m.gemm_plan.uses_skinny_kernel
    assert runner.cuda_graph_runner is not None


@pytest.mark.parametrize("bs", [1, 5, 16, 29, 40])
def test_fp8_graph_decode_equals_eager_and_scaled_mm(runner, bs):
    first = runner.model.model.layers[0].self_attn.qkv_proj  # same input on both sides: embedding + norm
    graph_logits, eager_logits, scaled_mm_logits, outputs = decode_logits_three_ways(runner, bs, capture=first)
    assert graph_logits.shape == (bs, runner.model_config.vocab_size) and torch.isfinite(graph_logits).all()
    torch.testing.assert_close(graph_logits, eager_logits, rtol=0, atol=1e-3)
    # The table's GEMM vs _scaled_mm on one projection's identical input: the sums agree to fp8 MMA precision.
    table_out, scaled_mm_out = outputs
    err = ((table_out - scaled_mm_out).abs().amax(dim=1) / scaled_mm_out.abs().amax(dim=1)).max().item()
    # Through 16 layers the difference grows: each layer re-quantizes its activations to e4m3 steps.
    cosine = torch.nn.functional.cosine_similarity(graph_logits, scaled_mm_logits, dim=-1).min().item()
    print(f"batch {bs}: table GEMM vs _scaled_mm, qkv_proj relative error {err:.2e}, logits cosine min {cosine:.5f}")
    assert err < 4e-3
    assert cosine > 0.98


def _prefill_logits(mr, prompts):
    fb, release = extend_batch(mr, prompts)
    try:
        return mr.forward(fb).next_token_logits.float().cpu()
    finally:
        release()


def test_fp8_model_tracks_the_bf16_model_on_the_same_weights(runner, tables):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 30000, (n,), generator=g).tolist() for n in (7, 300, 1000)]  # 1000: _scaled_mm
    fp8 = _prefill_logits(runner, prompts)
    bf16_runner = _runner(_server_args(), tables)
    try:
        bf16 = _prefill_logits(bf16_runner, prompts)
        assert bf16_runner.model.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    finally:
        del bf16_runner
        torch.cuda.empty_cache()
    cosine = torch.nn.functional.cosine_similarity(fp8, bf16, dim=-1)
    print(f"fp8 vs bf16 prefill logits, cosine {cosine.tolist()}")
    assert cosine.min().item() > 0.98, cosine
    assert not torch.equal(fp8, bf16)  # the quantized model really is another model
