"""SGLANG_KT_CPU_HOST_WAIT: its words, the driver flags they name, and a clear error for any other word."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

import importlib.util

import pytest

from sglang.srt.environ import envs
from sglang.srt.utils.cuda_context import HOST_WAIT_FLAGS


def test_every_host_wait_word_names_a_flag():
    assert set(HOST_WAIT_FLAGS) == set(envs.SGLANG_KT_CPU_HOST_WAIT.choices)
    assert envs.SGLANG_KT_CPU_HOST_WAIT.get() in HOST_WAIT_FLAGS  # the default


@pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-bindings is not installed here")
def test_flags_exist_in_the_driver_bindings():
    from cuda.bindings import driver

    flags = {name: getattr(driver.CUctx_flags, name) for name in HOST_WAIT_FLAGS.values()}
    assert len(set(flags.values())) == 3


def test_host_wait_accepts_its_words_and_rejects_others():
    with envs.SGLANG_KT_CPU_HOST_WAIT.override("Block"):
        assert envs.SGLANG_KT_CPU_HOST_WAIT.get() == "block"
    with envs.SGLANG_KT_CPU_HOST_WAIT.override("sleep"), pytest.raises(ValueError) as info:
        envs.SGLANG_KT_CPU_HOST_WAIT.get()
    assert "SGLANG_KT_CPU_HOST_WAIT" in str(info.value) and "block, yield, spin" in str(info.value)
