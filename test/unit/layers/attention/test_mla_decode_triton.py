"""The triton MLA decode kernel (absorbed, over the latent pool) against the torch path (mla_torch.absorbed_decode):
CPU under TRITON_INTERPRET=1 (fp32, tiny shapes); on a GPU bf16 and a CUDA-graph replay with changed lengths."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")
register_cuda_ci(est_time=30, suite="per-commit-cuda")

import pytest
import torch

from sglang.srt.layers.attention.mla_torch import absorbed_decode
from sglang.srt.layers.attention.triton_ops.mla_decode import mla_decode_fwd
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
