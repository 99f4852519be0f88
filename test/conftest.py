"""Shared pytest set-up: without a GPU, triton kernels run in the interpreter on CPU tensors."""

import os

import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit kernel is defined (module import time).
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Session-scoped servers shared by several files (test/registered/entrypoints/conftest.py). Under pytest-xdist
# (process-cpu: test/run_suite.py, --dist loadgroup) every file is one group, so a file's module-scoped servers
# stay in one worker, and the files using one of these fixtures form a single group: one start, not one per worker.
SHARED_SESSION_FIXTURES = ("smollm2_server",)


def pytest_collection_modifyitems(config, items):
    import pytest

    shared = {}
    for item in items:
        for name in SHARED_SESSION_FIXTURES:
            if name in getattr(item, "fixturenames", ()):
                shared[item.path] = name
    for item in items:
        item.add_marker(pytest.mark.xdist_group(shared.get(item.path, str(item.path))))
