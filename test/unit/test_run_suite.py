from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# test/run_suite.py: a CPU suite's pytest runs get their share of the cores' intra-op threads (OMP_NUM_THREADS),
# a value the user set is kept, and the GPU suite's environment is left alone; process-cpu's run spreads whole
# files over its xdist workers, longest first, and counts them when sharing the cores.

import importlib.util
import sys
from pathlib import Path

import pytest

RUN_SUITE = Path(__file__).resolve().parents[1] / "run_suite.py"


@pytest.fixture(scope="module")
def run_suite():
    spec = importlib.util.spec_from_file_location("run_suite", RUN_SUITE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_suite"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_cpu_parts_share_the_cores(run_suite, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(run_suite.os, "cpu_count", lambda: 8)
    assert run_suite.suite_env("unit-cpu", 2)["OMP_NUM_THREADS"] == "4"
    assert run_suite.suite_env("process-cpu", 1)["OMP_NUM_THREADS"] == "8"
    monkeypatch.setattr(run_suite.os, "cpu_count", lambda: 1)
    assert run_suite.suite_env("process-cpu", 2)["OMP_NUM_THREADS"] == "1"  # never 0


def test_the_users_value_and_the_gpu_suite_are_left_alone(run_suite, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert run_suite.suite_env("unit-cpu", 2)["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "OMP_NUM_THREADS" not in run_suite.suite_env("per-commit-cuda", 1)


def test_process_cpu_spreads_whole_files_longest_first(run_suite):
    Reg = run_suite.Registration
    chosen = [Reg(Path("a.py"), "per-commit-cpu", 10.0), Reg(Path("b.py"), "per-commit-cpu", 90.0)]
    cmd = run_suite.pytest_command(chosen, 15, ["-x"], run_suite.workers("process-cpu"))
    assert cmd[cmd.index("-n") + 1] == "2" and cmd[cmd.index("--dist") + 1] == "loadgroup"
    assert cmd.index("b.py") < cmd.index("a.py") and cmd[-1] == "-x"
    one = run_suite.pytest_command(chosen, 15, [], run_suite.workers("unit-cpu"))
    assert "-n" not in one and one.index("a.py") < one.index("b.py")  # a single process keeps the files' order


def test_the_cores_are_shared_by_every_pytest_process(run_suite, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(run_suite.os, "cpu_count", lambda: 6)
    at_once = run_suite.workers("unit-cpu") + run_suite.workers("process-cpu")
    assert at_once == 3 and run_suite.suite_env("process-cpu", at_once)["OMP_NUM_THREADS"] == "2"


def test_files_sharing_a_session_server_form_one_xdist_group():
    spec = importlib.util.spec_from_file_location("suite_conftest", RUN_SUITE.parent / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    class Item:
        def __init__(self, path: str, fixtures: tuple) -> None:
            self.path, self.fixturenames, self.groups = Path(path), fixtures, []

        def add_marker(self, mark) -> None:
            self.groups += [mark.args[0]] if mark.name == "xdist_group" else []

    items = [
        Item("a/test_http.py", ("base_url", "smollm2_server")),
        Item("a/test_http.py", ("tok",)),  # same file, no server: stays with its file
        Item("a/test_fuzz.py", ("smollm2_server",)),
        Item("a/test_own.py", ("base_url",)),
    ]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.groups for i in items] == [["smollm2_server"], ["smollm2_server"], ["smollm2_server"], ["a/test_own.py"]]
