"""Run one CI suite: the test files whose register_*_ci(...) calls name it.

    python test/run_suite.py --suite per-commit-cpu     # CI (no GPU): unit-cpu, then process-cpu
    python test/run_suite.py --suite unit-cpu           # in-process unit tests (test/unit/**)
    python test/run_suite.py --suite process-cpu        # process-level tests (test/registered/**)
    python test/run_suite.py --suite per-commit-cuda    # the GPU machine
    python test/run_suite.py --suite per-commit-2-gpu   # the two-GPU machine (nvidia-h200-x2)
    python test/run_suite.py --suite unit-cpu -- -x -k sampler   # after `--`: extra pytest arguments
    python test/run_suite.py --suite per-commit-cuda --shard 2/7    # the second of 7 parts (one device call each)

The markers are read from the source text (files are not imported), so a file is in a suite exactly
when it says so. The CPU files register for `per-commit-cpu`; where they live splits them into the two
CPU suites. Each suite is one pytest run that prints its 15 slowest tests (process-cpu's with two pytest-xdist
workers taking whole files); `per-commit-cpu` runs both (`--parallel`: at the same time, each one's output printed
when it ends) and fails if either fails. `--shard K/N` runs the K-th of N parts of a suite, its files dealt longest
first (by their est_time) to the part with the least time so far: the GPU suite's files are estimated at ~3,600 s,
and one device call runs 600 s at most.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent
MARKERS = {"register_cpu_ci": "per-commit-cpu", "register_cuda_ci": "per-commit-cuda"}
CPU_SUITE = "per-commit-cpu"
# The CPU suite's two parts: the registered suite, the folder under test/, the pytest processes.


@dataclass(frozen=True)
class CpuPart:
    registered_suite: str
    folder: str  # under test/
    # pytest-xdist worker processes, each taking whole files (--dist loadgroup with test/conftest.py's scheduler: a
    # module's shared server stays in one process, and so does a session server several files share). Each server
    # computes on one thread, so one pytest process left a core idle once the unit tests were done: on the 2-core
    # machine process-cpu took 878 s in one process, 595 s in two, and the whole suite 729 s with three (each
    # process's share of the cores then rounds down to one thread and they oversubscribe). Those three were
    # measured while xdist still split files over workers (test/conftest.py says why).
    workers: int


CPU_PARTS: Dict[str, CpuPart] = {
    "unit-cpu": CpuPart(CPU_SUITE, "unit", workers=1),
    "process-cpu": CpuPart(CPU_SUITE, "registered", workers=2),
}
PYTEST_NO_TESTS = 5  # pytest's exit status when it collected nothing
# torch's intra-op threads per process in the CPU suites: by default each process takes every core, and the suites'
# processes (two pytest runs at once, each test's servers with three processes) then oversubscribe the cores, whose
# OpenMP threads spin-wait for each other. One core's share each: test_overlap_schedule.py took 128 s with the
# default and 47 s with OMP_NUM_THREADS=1 on the 2-core machine (the other core busy). A value the user set wins.
THREADS_ENV = "OMP_NUM_THREADS"
# Plugins that other packages install and no test here uses; importing them costs seconds per pytest run.
UNUSED_PLUGINS = ["langsmith_plugin", "hypothesispytest"]


@dataclass(frozen=True)
class Registration:
    path: Path
    suite: str
    est_time: float


def read_registrations(path: Path) -> List[Registration]:
    tree = ast.parse(path.read_text(), filename=str(path))
    regs = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.func.id not in MARKERS:
            continue
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        args = [ast.literal_eval(a) for a in call.args]
        est = kwargs.get("est_time", args[0] if args else 60)
        suite = kwargs.get("suite", args[1] if len(args) > 1 else MARKERS[call.func.id])
        regs.append(Registration(path, suite, float(est)))
    return regs


def collect(suite: str) -> tuple[list[Registration], list[Path]]:
    """The registrations of `suite` (a registered suite name or one of CPU_PARTS) and the unregistered files."""
    part = CPU_PARTS.get(suite, CpuPart(suite, "", workers=1))
    registered_suite, folder = part.registered_suite, part.folder
    under = ROOT / folder
    chosen, unregistered = [], []
    for path in sorted(ROOT.rglob("test_*.py")):
        regs = read_registrations(path)
        if not regs:
            unregistered.append(path)
        chosen += [r for r in regs if r.suite == registered_suite and path.is_relative_to(under)]
    return chosen, unregistered


def plan(suite: str) -> Optional[List[Registration]]:
    """Print what `suite` runs and skips; None when a file is unregistered or nothing is chosen."""
    chosen, unregistered = collect(suite)
    chosen_paths = {r.path for r in chosen}
    skipped = [p for p in sorted(ROOT.rglob("test_*.py")) if p not in chosen_paths and p not in unregistered]
    print(f"Suite {suite}: {len(chosen)} file(s), estimated {sum(r.est_time for r in chosen):.0f} s")
    for r in chosen:
        print(f"  run   {r.path.relative_to(ROOT)} (~{r.est_time:.0f} s)")
    for p in skipped:
        print(f"  skip  {p.relative_to(ROOT)} (another suite)")
    for p in unregistered:
        print(f"  ERROR {p.relative_to(ROOT)} has no register_*_ci marker")
    if unregistered:
        return None
    if not chosen:
        print(f"Suite {suite}: nothing registered for it")
        return None
    return chosen


def parse_shard(text: str) -> tuple[int, int]:
    """`K/N` -> (K, N) with 1 <= K <= N (argparse's type for --shard: a bad value is a usage error naming it)."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        index = count = 0
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"--shard wants K/N with 1 <= K <= N, got {text!r}")
    return index, count


def shard(chosen: List[Registration], index: int, count: int) -> List[Registration]:
    """Part `index` (1-based) of `count`: the files dealt longest first (est_time) to the part with the least
    estimated time so far (ties: the lower part), in the suite's order. Every file lands in exactly one part."""
    loads = [0.0] * count
    part_of = {}
    for reg in sorted(chosen, key=lambda r: -r.est_time):  # a stable sort: equal estimates keep the suite's order
        lightest = loads.index(min(loads))
        part_of[reg.path] = lightest
        loads[lightest] += reg.est_time
    return [reg for reg in chosen if part_of[reg.path] == index - 1]


def workers(suite: str) -> int:
    return CPU_PARTS[suite].workers if suite in CPU_PARTS else 1


def suite_env(suite: str, processes_at_once: int) -> Dict[str, str]:
    """The environment of a suite's pytest run: a CPU suite's processes (`processes_at_once` pytest processes in
    all, xdist workers counted) get their share of the cores' threads."""
    env = dict(os.environ)
    if suite in CPU_PARTS or suite == CPU_SUITE:
        env.setdefault(THREADS_ENV, str(max(1, (os.cpu_count() or 1) // processes_at_once)))
    return env


def pytest_command(chosen: List[Registration], durations: int, extra: List[str], num_workers: int = 1) -> List[str]:
    """One pytest run over `chosen`; with several workers (pytest-xdist, whole files each) the files longest by
    their est_time go first, so the last file to start is a short one."""
    blocked = [arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")]
    if num_workers > 1:
        chosen = sorted(chosen, key=lambda r: -r.est_time)
    # loadgroup: test/conftest.py makes each file a unit (files sharing a session server, one unit); units are handed
    # out in the order given here (xdist would otherwise reorder them by their number of tests)
    spread = ["-n", str(num_workers), "--dist", "loadgroup", "--no-loadscope-reorder"] if num_workers > 1 else []
    return [
        sys.executable, "-m", "pytest", "-q", "-rs", f"--durations={durations}", *blocked, *spread,
        *[str(r.path) for r in chosen], *extra,
    ]  # fmt: skip


def verdict(suite: str, rc: int, seconds: float) -> int:
    """Print the suite's time and status; a run that collected no test is a failure (the suite has files)."""
    if rc == PYTEST_NO_TESTS:
        print(f"Suite {suite}: pytest collected no test (exit code 5), counted as a failure")
        rc = 1
    print(f"Suite {suite} finished in {seconds:.0f} s with exit code {rc}")
    return rc


def first_failure(rcs: Dict[str, int]) -> int:
    """The first non-zero exit status (a signal's is negative), else 0."""
    return next((rc for rc in rcs.values() if rc != 0), 0)


def run_one(suite: str, durations: int, extra: List[str], part: Optional[tuple[int, int]] = None) -> int:
    chosen = plan(suite)
    if chosen is None:
        return 2
    if part is not None:
        chosen = shard(chosen, *part)
        print(f"Shard {part[0]}/{part[1]}: {len(chosen)} file(s), estimated {sum(r.est_time for r in chosen):.0f} s")
        for r in chosen:
            print(f"  run   {r.path.relative_to(ROOT)}")
        if not chosen:
            print(f"Shard {part[0]}/{part[1]}: no file (more parts than files)")
            return 0
    start = time.monotonic()
    n = workers(suite)
    rc = subprocess.call(pytest_command(chosen, durations, extra, n), cwd=ROOT.parent, env=suite_env(suite, n))
    return verdict(suite, rc, time.monotonic() - start)


def run_parallel(suites: List[str], durations: int, extra: List[str]) -> Dict[str, int]:
    """Every suite in its own pytest process at once; each one's output is printed whole when it ends."""
    plans = {s: plan(s) for s in suites}
    if any(p is None for p in plans.values()):
        return {s: 2 for s in suites}
    start, running, rcs = time.monotonic(), {}, {}
    processes = sum(workers(s) for s in suites)
    for suite, chosen in plans.items():
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(
            pytest_command(chosen, durations, extra, workers(suite)),
            cwd=ROOT.parent,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=suite_env(suite, processes),
        )
        running[proc] = (suite, log)
    print(f"Running {', '.join(suites)} at the same time", flush=True)
    while running:
        time.sleep(0.5)
        for proc in [p for p in running if p.poll() is not None]:
            suite, log = running.pop(proc)
            log.seek(0)
            print(f"\n======== {suite} ========", flush=True)
            sys.stdout.write(log.read())
            log.close()
            rcs[suite] = verdict(suite, proc.returncode, time.monotonic() - start)
            sys.stdout.flush()
    return rcs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default=CPU_SUITE)
    parser.add_argument("--durations", type=int, default=15, help="print this many slowest tests (pytest)")
    parser.add_argument("--parallel", action="store_true", help="per-commit-cpu: run its two parts at once")
    parser.add_argument(
        "--shard", type=parse_shard, help="K/N: the K-th of N parts of a suite other than per-commit-cpu"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra arguments passed to pytest (after --)")
    args = parser.parse_args()
    if args.suite != CPU_SUITE:
        return run_one(args.suite, args.durations, args.pytest_args, args.shard)
    if args.shard is not None:
        parser.error(f"--shard: {CPU_SUITE} runs its two parts whole (shard unit-cpu or process-cpu instead)")
    start, parts = time.monotonic(), list(CPU_PARTS)
    if args.parallel:
        rcs = run_parallel(parts, args.durations, args.pytest_args)
    else:
        rcs = {part: run_one(part, args.durations, args.pytest_args) for part in parts}
    summary = ", ".join(f"{p}: exit code {rc}" for p, rc in rcs.items())
    print(f"Suite {CPU_SUITE} finished in {time.monotonic() - start:.0f} s ({summary})")
    return first_failure(rcs)


if __name__ == "__main__":
    sys.exit(main())
