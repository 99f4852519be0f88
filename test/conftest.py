"""Shared pytest set-up: without a GPU, triton kernels run in the interpreter on CPU tensors."""

import functools
import gc
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit kernel is defined (module import time).
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Session-scoped servers shared by several files (test/registered/entrypoints/conftest.py). Under pytest-xdist
# (process-cpu: test/run_suite.py, --dist loadgroup) every file is one unit of work, so a file's module-scoped
# servers and models start in one worker only, and the files using one of these fixtures form a single unit: one
# start, not one per worker.
SHARED_SESSION_FIXTURES = ("smollm2_server",)


@functools.lru_cache(maxsize=None)
def _file_unit(path: Path) -> str:
    """A test file's unit of work: the shared fixture it names (read from its source, as run_suite.py reads the
    suite markers; the controller process collects nothing), else the file itself."""
    try:
        text = path.read_text()
    except OSError:
        return str(path)
    return next((name for name in SHARED_SESSION_FIXTURES if name in text), str(path))


def xdist_unit(rootpath: Path, nodeid: str) -> str:
    return _file_unit(rootpath / nodeid.split("::", 1)[0])


def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup, grouped by xdist_unit(). xdist's own loadgroup reads `xdist_group` markers by appending
    "@group" to item._nodeid, which pytest 9 no longer reads (Node.nodeid comes from _id): every test was its own
    unit, a file's tests ran on both workers, and its module-scoped servers started once per worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(config.rootpath, nodeid)

    return FileUnitScheduling(config, log)


@pytest.fixture(autouse=True, scope="module")
def _cuda_memory_released_after_each_file():
    """A GPU test file's models are gone before the next file starts: tests that compare free-memory readings
    (the KV sizing and reservation tests) otherwise see what an earlier file's reference cycles still hold (6.5 GiB
    once, the fp8 runner of test_fp8_quantization_gpu.py). Last to tear down, after the file's own fixtures."""
    yield
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def pytest_unconfigure(config):
    """The last hook of a pytest process (the controller and each xdist worker): what the tests imported and built
    goes to the collector's permanent generation, so the interpreter's final collections do not rescan it at exit
    (about a CPU-second per process with torch and transformers imported; as the server's processes do)."""
    gc.freeze()
