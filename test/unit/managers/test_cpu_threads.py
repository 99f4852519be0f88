"""managers/scheduler_process.py's cpu_intra_op_threads: CPU scheduler ranks share the node's cores but one (the
launcher's and the detokenizer's processes work at every step too); the user's OMP_NUM_THREADS always wins."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="per-commit-cpu")

import pytest

from sglang.srt.managers.scheduler_process import cpu_intra_op_threads


@pytest.mark.parametrize(
    "cores,ranks,expected", [(2, 1, 1), (16, 1, 15), (16, 2, 7), (2, 2, 1), (1, 1, 1), (64, 4, 15)]
)
def test_ranks_share_all_cores_but_one(cores, ranks, expected):
    assert cpu_intra_op_threads(cores, ranks, None) == expected
    assert cpu_intra_op_threads(cores, ranks, "") == expected  # set but empty: not a choice


@pytest.mark.parametrize("value", ["1", "4"])
def test_the_users_omp_num_threads_is_kept(value):
    assert cpu_intra_op_threads(16, 1, value) is None
