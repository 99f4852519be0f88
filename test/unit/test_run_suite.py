from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# test/run_suite.py: a CPU suite's pytest runs get their share of the cores' intra-op threads (OMP_NUM_THREADS),
# a value the user set is kept, and the GPU suite's environment is left alone; process-cpu's run spreads whole
# files over its xdist workers, longest first, and counts them when sharing the cores.

import importlib.util
import subprocess
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
    assert cmd.index("b.py") < cmd.index("a.py") and cmd[-1] == "-x" and "--no-loadscope-reorder" in cmd
    one = run_suite.pytest_command(chosen, 15, [], run_suite.workers("unit-cpu"))
    assert "-n" not in one and one.index("a.py") < one.index("b.py")  # a single process keeps the files' order


def test_the_cores_are_shared_by_every_pytest_process(run_suite, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(run_suite.os, "cpu_count", lambda: 6)
    at_once = run_suite.workers("unit-cpu") + run_suite.workers("process-cpu")
    assert at_once == 3 and run_suite.suite_env("process-cpu", at_once)["OMP_NUM_THREADS"] == "2"


def test_files_sharing_a_session_server_form_one_unit(tmp_path):
    spec = importlib.util.spec_from_file_location("suite_conftest", RUN_SUITE.parent / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    (tmp_path / "test_http.py").write_text("def test_a(base_url, smollm2_server): ...\ndef test_b(tok): ...\n")
    (tmp_path / "test_fuzz.py").write_text("def test_c(smollm2_server): ...\n")
    (tmp_path / "test_own.py").write_text("def test_d(base_url): ...\n")
    units = [
        conftest.xdist_unit(tmp_path, nodeid)
        for nodeid in ("test_http.py::test_a", "test_http.py::test_b", "test_fuzz.py::test_c", "test_own.py::test_d[x]")
    ]
    assert units == ["smollm2_server", "smollm2_server", "smollm2_server", str(tmp_path / "test_own.py")]


def test_xdist_keeps_each_file_on_one_worker(run_suite, tmp_path):
    """End to end: under `-n 2 --dist loadgroup` with test/conftest.py, every test of a file runs on one worker, and
    so do all the files naming a shared session fixture (split over workers, their servers start twice)."""
    (tmp_path / "conftest.py").write_text((RUN_SUITE.parent / "conftest.py").read_text())
    record = f"open({str(tmp_path / 'ran')!r}, 'a').write(__name__ + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')"
    files = {"a": "", "b": "", "c": "", "s1": "  # smollm2_server", "s2": "  # smollm2_server"}
    for name, comment in files.items():
        tests = "".join(f"def test_{i}():{comment}\n    {record}\n\n\n" for i in range(6))
        (tmp_path / f"test_{name}.py").write_text("import os\n\n\n" + tests)
    # The suite's own command (its plugin blocks, -n 2 --dist loadgroup --no-loadscope-reorder), not a copy of it.
    chosen = [run_suite.Registration(tmp_path / f"test_{name}.py", "per-commit-cpu", 1.0) for name in files]
    cmd = run_suite.pytest_command(chosen, 0, ["-p", "no:cacheprovider"], num_workers=2)
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]
    runs = [line.split() for line in (tmp_path / "ran").read_text().splitlines()]
    assert len(runs) == 6 * len(files)
    workers = {module: {w for m, w in runs if m == module} for module, _ in runs}
    assert all(len(w) == 1 for w in workers.values()), workers
    assert workers["test_s1"] == workers["test_s2"], workers
    assert len({w for _, w in runs}) == 2  # both workers did take files


def test_shards_deal_every_file_once_and_balance_the_estimates(run_suite):
    """--shard K/N: each file in exactly one part, the longest dealt first to the lightest part, the suite's order
    kept inside a part; the parts' estimates within the longest file of each other."""
    Reg = run_suite.Registration
    chosen = [
        Reg(Path(f"f{i}.py"), "per-commit-cuda", est) for i, est in enumerate([420, 80, 120, 90, 30, 240, 60, 10])
    ]
    parts = [run_suite.shard(chosen, k, 3) for k in (1, 2, 3)]
    assert sorted(r.path for part in parts for r in part) == sorted(r.path for r in chosen)
    assert parts[0] == [chosen[0]]  # 420 alone: every other file went to the two lighter parts
    for part in parts:
        assert part == [r for r in chosen if r in part]
    loads = [sum(r.est_time for r in part) for part in parts]
    assert max(loads) - min(loads) <= 420 and sum(loads) == 1050
    nine = [run_suite.shard(chosen, k, 9) for k in range(1, 10)]  # more parts than files: one each, one empty
    assert sorted(len(part) for part in nine) == [0] + [1] * 8


def test_a_bad_shard_is_a_usage_error_naming_the_flag(run_suite):
    assert run_suite.parse_shard("2/7") == (2, 7)
    for bad in ("0/3", "4/3", "2", "a/b", "1/2/3"):
        with pytest.raises(run_suite.argparse.ArgumentTypeError, match="--shard wants K/N"):
            run_suite.parse_shard(bad)
    done = subprocess.run(
        [sys.executable, str(RUN_SUITE), "--suite", "per-commit-cpu", "--shard", "1/2"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--shard" in done.stderr and "unit-cpu" in done.stderr
