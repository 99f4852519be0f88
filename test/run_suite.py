"""Run one CI suite: the test files whose register_*_ci(...) calls name it.

    python test/run_suite.py --suite per-commit-cpu     # CI (no GPU)
    python test/run_suite.py --suite per-commit-cuda    # the GPU machine
    python test/run_suite.py --suite per-commit-2-gpu   # the two-GPU machine (nvidia-h200-x2)

The markers are read from the source text (files are not imported), so a file is in a suite exactly
when it says so. Prints what it ran and what it skipped, then exits with pytest's status.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent
MARKERS = {"register_cpu_ci": "per-commit-cpu", "register_cuda_ci": "per-commit-cuda"}


@dataclass
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
    chosen, unregistered = [], []
    for path in sorted(ROOT.rglob("test_*.py")):
        regs = read_registrations(path)
        if not regs:
            unregistered.append(path)
        chosen += [r for r in regs if r.suite == suite]
    return chosen, unregistered


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", default="per-commit-cpu")
    parser.add_argument("--timeout-per-file", type=int, default=1800)
    parser.add_argument("pytest_args", nargs="*", help="extra arguments passed to pytest")
    args = parser.parse_args()
    chosen, unregistered = collect(args.suite)
    all_files = sorted(ROOT.rglob("test_*.py"))
    skipped = [p for p in all_files if p not in {r.path for r in chosen} and p not in unregistered]
    print(f"Suite {args.suite}: {len(chosen)} file(s), estimated {sum(r.est_time for r in chosen):.0f} s")
    for r in chosen:
        print(f"  run   {r.path.relative_to(ROOT)} (~{r.est_time:.0f} s)")
    for p in skipped:
        print(f"  skip  {p.relative_to(ROOT)} (registered for another suite)")
    for p in unregistered:
        print(f"  ERROR {p.relative_to(ROOT)} has no register_*_ci marker")
    if unregistered:
        return 2
    if not chosen:
        print("nothing to run")
        return 1
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", *[str(r.path) for r in chosen], *args.pytest_args]
    rc = subprocess.call(cmd, cwd=ROOT.parent)
    print(f"Suite {args.suite} finished in {time.monotonic() - start:.0f} s with exit code {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
