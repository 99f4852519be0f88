"""The one-kernel batch metadata (kv_indices + decode split counts) equals the torch ops it replaces."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")
register_cuda_ci(est_time=10, suite="per-commit-cuda")

import pytest
import torch

from sglang.srt.layers.attention.triton_backend import fill_kv_indices
from sglang.srt.layers.attention.triton_ops import get_num_kv_splits
from sglang.srt.layers.attention.triton_ops.kv_indices import fill_kv_indices_triton
from sglang.test.gpu_utils import triton_test_devices

DEVICES = triton_test_devices()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("min_splits", [1, 33])
def test_fill_kv_indices_triton_matches_torch(device, min_splits):
    gen = torch.Generator().manual_seed(min_splits)
    req_to_token = torch.randint(1, 10**6, (6, 1500), generator=gen, dtype=torch.int32).to(device)
    rows = torch.tensor([4, 0, 5, 2], device=device)
    lens = torch.tensor([1, 0, 1500, 513], device=device)  # one token, empty, a full row, > one BLOCK
    indptr = torch.zeros(5, dtype=torch.int32, device=device)
    torch.cumsum(lens, dim=0, dtype=torch.int32, out=indptr[1:])
    total = int(lens.sum())
    want = torch.full((total + 7,), -1, dtype=torch.int32, device=device)
    fill_kv_indices(want, req_to_token, rows, lens, indptr, total)
    got = torch.full_like(want, -1)
    splits = torch.zeros(4, dtype=torch.int32, device=device)
    fill_kv_indices_triton(got, req_to_token, rows, indptr, splits, 16, 256, min_splits, 128)
    assert torch.equal(got, want), "the same slots in the same order, nothing written past the total"
    want_splits = torch.zeros_like(splits)
    get_num_kv_splits(want_splits, lens, 16, 256, min_splits, 128)
    assert splits.tolist() == want_splits.tolist()
    only_indices = torch.full_like(want, -1)
    fill_kv_indices_triton(only_indices, req_to_token, rows, indptr)  # extend: no split counts
    assert torch.equal(only_indices, want)
