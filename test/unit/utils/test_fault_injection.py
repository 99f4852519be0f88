from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# SGLANG_TEST_FAULT_INJECTION: parsed once into a frozen plan; bad specs are refused by name; the
# injected out-of-memory error is the exception torch raises and the scheduler recognises.

import pytest
import torch

from sglang.srt.managers.scheduler_components.failure_policy import is_device_fault, is_device_oom
from sglang.srt.utils.fault_injection import FaultPlan


def test_parse_and_fire():
    plan = FaultPlan.parse(" forward_oom=3, forward_error=5 ,startup_hang=detokenizer")
    assert (plan.forward_oom_at, plan.forward_error_at, plan.startup_hang) == (3, 5, "detokenizer")
    assert FaultPlan.parse("") == FaultPlan()
    plan.before_forward(2)  # nothing happens before the chosen forward
    with pytest.raises(torch.OutOfMemoryError) as e:
        plan.before_forward(3)
    assert is_device_oom(e.value) and not is_device_fault(e.value)
    with pytest.raises(RuntimeError) as e:
        plan.before_forward(5)
    assert not is_device_oom(e.value)


@pytest.mark.parametrize(
    "spec,word",
    [
        ("forward_oom", "key=value"),
        ("forward_oom=0", "count"),
        ("forward_oom=x", "count"),
        ("startup_exit=tokenizer", "startup_exit"),
        ("explode=1", "unknown key"),
    ],
)
def test_bad_specs_are_refused(spec, word):
    with pytest.raises(ValueError, match=word):
        FaultPlan.parse(spec)


def test_oom_and_device_fault_recognition():
    assert is_device_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert is_device_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_device_oom(ValueError("out of memory"))  # only what the allocators raise
    assert is_device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_device_fault(RuntimeError("shape mismatch"))
