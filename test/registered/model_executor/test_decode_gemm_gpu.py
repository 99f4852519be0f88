"""With a tuned table naming the model's shapes, decode runs every projection through the skinny GEMM (in CUDA
graphs, with programmatic dependent launch; split-K o_proj and down with the residual add and norm after them in
their sum kernels) and gives the logits of cuBLAS and separate norm kernels up to bf16 rounding."""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=90, suite="per-commit-cuda")

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, decode_logits_three_ways, has_gpu, shape_config_dir

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

MODEL = "Llama-1B-random"


def _tile(block_m: int, split_k: int) -> dict:
    return dict(block_m=block_m, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=split_k, pdl=True)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from transformers import AutoConfig

    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.environ import envs
    from sglang.srt.layers.decode_gemm.shapes import projection_shapes
    from sglang.srt.layers.decode_gemm.table import device_table_path, shape_key, update_table_file
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    model_dir = shape_config_dir(MODEL)
    tables = str(tmp_path_factory.mktemp("decode-gemm-tables"))
    device = torch.cuda.get_device_name()
    # Batches 1..8 one tile, 9..16 split-K, 17..32 the 32-row tile; above 32 cuBLAS.
    entries = {"8": _tile(16, 1), "16": _tile(16, 2), "32": _tile(32, 2)}
    shapes = projection_shapes(AutoConfig.from_pretrained(model_dir))
    update_table_file(
        device_table_path(device, tables),
        device,
        f"{MODEL} tp1",
        {shape_key(n, k): entries for n, k in shapes.values()},
    )
    args = ServerArgs(
        model_path=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_total_tokens=65536,
        max_running_requests=64,
        cuda_graph_max_bs=48,
        mem_fraction_static=0.6,
    )
    with envs.SGLANG_DECODE_GEMM_CONFIG_DIR.override(tables):
        return ModelRunner(resolve_engine_config(args))


def _linears(mr):
    from sglang.srt.layers.linear import LinearBase

    return [m for m in mr.model.modules() if isinstance(m, LinearBase)]


def test_split_k_projections_carry_the_residual_add_and_norm_after_them(runner, monkeypatch):
    """At batch 13 (split-K configs) o_proj and down of every layer add the residual and apply the next norm in
    their sum kernels (the eager pass; the graph replays the same kernels); at 5 (split 1) none do."""
    from sglang.srt.layers.decode_gemm import kernel

    fused = []
    real = kernel.skinny_linear
    monkeypatch.setattr(
        kernel, "skinny_linear", lambda *a, **kw: fused.append(kw.get("add_norm") is not None) or real(*a, **kw)
    )
    layers = runner.model_config.num_hidden_layers
    for bs, expected in ((13, 2 * layers), (5, 0)):
        fused.clear()
        decode_logits_three_ways(runner, bs)
        assert sum(fused) == expected and len(fused) == 4 * layers  # eager pass: four projections a layer


def test_every_projection_has_the_tables_plan(runner):
    layers = runner.model_config.num_hidden_layers
    linears = _linears(runner)
    assert len(linears) == 4 * layers and all(m.gemm_plan.uses_skinny_kernel for m in linears)
    assert runner.cuda_graph_runner is not None


@pytest.mark.parametrize("bs", [1, 5, 8, 13, 32, 40])
def test_skinny_graph_decode_equals_cublas_eager(runner, bs):
    graph_logits, eager_logits, cublas_logits, _ = decode_logits_three_ways(runner, bs)
    assert graph_logits.shape == cublas_logits.shape == (bs, runner.model_config.vocab_size)
    torch.testing.assert_close(graph_logits, eager_logits, rtol=0, atol=1e-3)
    # Other kernels, other rounding (batch 40 is past the table: cuBLAS on both sides, exactly or nearly equal).
    cosine = torch.nn.functional.cosine_similarity(graph_logits, cublas_logits, dim=-1)
    assert cosine.min().item() > 0.999, cosine
