"""lm-eval (PyPI `lm-eval==0.4.13`, EleutherAI's evaluation harness) in a virtualenv of its own, for tests
that score our server with it through `local-completions` (its OpenAI-completions client):

    python = ensure_lm_eval_venv()
    subprocess.run([python, "-m", "lm_eval", "--model", "local-completions", ...], env=client_env())

The venv holds lm-eval with its `api` extra (the HTTP client) and transformers, which loads the tokenizer
from a local directory (lm-eval's `remote` tokenizer speaks vLLM's /tokenizer_info, not SGLang's
endpoints). `POSTCAP_LM_EVAL_VENV` overrides the venv's location.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

from sglang.test.client_venv import client_env, default_venv_dir, ensure_client_venv

LM_EVAL_VERSION = "0.4.13"
LM_EVAL_REQUIREMENTS = (f"lm-eval[api]=={LM_EVAL_VERSION}", "transformers==4.51.1")
VENV_ENV_VAR = "POSTCAP_LM_EVAL_VENV"


def _check(python: str) -> None:
    code = "from importlib.metadata import version; print(version('lm-eval'))"
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, env=client_env(), timeout=120)
    if r.returncode != 0 or r.stdout.strip() != LM_EVAL_VERSION:
        raise RuntimeError(f"lm-eval {LM_EVAL_VERSION} is not what {python} has: {r.stdout}{r.stderr[-2000:]}")


def ensure_lm_eval_venv(venv: Optional[Path] = None) -> str:
    """The venv's python with lm-eval installed (about a minute and 600 MB from PyPI the first time)."""
    venv = venv or default_venv_dir(f"lm-eval-{LM_EVAL_VERSION}", VENV_ENV_VAR)
    return ensure_client_venv(venv, [list(LM_EVAL_REQUIREMENTS)], check=_check)
