"""pdl_available: off for CPU tensors; on CUDA it follows the device's compute capability, asked once per device
(it was asked before every triton launch of the decode path)."""

import pytest
import torch

from sglang.srt.layers import pdl
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu

register_cpu_ci(est_time=2, suite="per-commit-cpu")
register_cuda_ci(est_time=5, suite="per-commit-cuda")


def test_cpu_tensors_never_use_pdl():
    assert pdl.pdl_available(torch.zeros(1)) is False


@pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)
def test_cuda_follows_capability_and_asks_once(monkeypatch):
    x = torch.zeros(1, device="cuda")
    expected = torch.cuda.get_device_capability()[0] >= 9
    pdl._device_supports_pdl.cache_clear()
    calls = []
    real = torch.cuda.get_device_capability

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(torch.cuda, "get_device_capability", counted)
    assert [pdl.pdl_available(x) for _ in range(5)] == [expected] * 5
    assert len(calls) == 1
