"""set_host_wait: its words name the driver's scheduling flags; KT models on CUDA block (a polling wait took the
expert threads' cores: benchmark/kt_decode/)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

import importlib.util

import pytest

from sglang.srt.utils.cuda_context import HOST_WAIT_FLAGS


def test_every_host_wait_word_names_a_flag():
    assert HOST_WAIT_FLAGS == {
        "block": "CU_CTX_SCHED_BLOCKING_SYNC",
        "yield": "CU_CTX_SCHED_YIELD",
        "spin": "CU_CTX_SCHED_SPIN",
    }


@pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-bindings is not installed here")
def test_flags_exist_in_the_driver_bindings():
    from cuda.bindings import driver

    flags = {name: getattr(driver.CUctx_flags, name) for name in HOST_WAIT_FLAGS.values()}
    assert len(set(flags.values())) == 3


def test_kt_models_on_cuda_block_while_waiting(monkeypatch):
    """The runner asks for blocking waits exactly when KT experts share the CPU (read from the KT record)."""
    from sglang.srt.model_executor import model_runner

    asked = []
    monkeypatch.setattr(model_runner, "set_host_wait", lambda gpu, mode: asked.append((gpu, mode)))
    monkeypatch.setattr(model_runner.torch.cuda, "set_device", lambda gpu: None)
    monkeypatch.setattr(model_runner.torch.cuda, "init", lambda: None)
    monkeypatch.setattr(model_runner.parallel_state, "initialize_model_parallel", lambda tp: None)

    class Runner(model_runner.ModelRunner):
        def __init__(self, kt) -> None:  # only what init_torch_distributed reads
            self.device, self.gpu_id, self.tp_size = "cuda", 3, 1
            self.config = type("Config", (), {"kt": kt})()

    Runner(kt=None).init_torch_distributed()
    assert asked == []
    Runner(kt=object()).init_torch_distributed()
    assert asked == [(3, "block")]
