"""Compile kernel.cpp once per machine and load it with ctypes.

The library is plain C ABI (no torch headers, no Python API), so any C++20 compiler builds it in a
second or two. -march=native tunes it to this CPU (AVX-512 / AMX machines get 16-wide loops), so
the cache key holds the compiler, its flags, the source and the CPU's feature flags. Another `march`
(the tests' x86-64-v3: AVX2, no AVX-512) builds the paths a CPU without AVX-512 takes. Several
processes (tensor-parallel ranks) may build at once: each writes its own temporary file and renames
it into place, and the rename is atomic.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

from sglang.srt.environ import envs

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.cpp")
FLAGS = ("-O3", "-std=c++20", "-shared", "-fPIC", "-pthread")


class KernelBuildError(RuntimeError):
    pass


def _compiler() -> str:
    cxx = envs.SGLANG_KT_CPU_CXX.get() or os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise KernelBuildError(
            f"the KT CPU experts kernel needs a C++20 compiler, and {cxx!r} was not found: install g++ "
            "(e.g. apt install g++) or point SGLANG_KT_CPU_CXX at one"
        )
    return path


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> str:
    root = envs.SGLANG_KT_CPU_KERNEL_CACHE.get()
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "sglang", "kt_cpu")
    os.makedirs(root, exist_ok=True)
    return root


@functools.lru_cache(maxsize=None)
def load_kernel_library(march: str = "native") -> ctypes.CDLL:
    """The kernel compiled with -march=`march` (built on first use, then taken from the cache)."""
    cxx = _compiler()
    with open(SOURCE, "rb") as f:
        source = f.read()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    flags = (*FLAGS, f"-march={march}")
    key = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(flags).encode(), _cpu_flags().encode()]))
    target = os.path.join(_cache_dir(), f"kt_cpu_experts_{key.hexdigest()[:16]}.so")
    if not os.path.exists(target):
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
        os.close(fd)
        result = subprocess.run([cxx, *flags, "-o", tmp, SOURCE, "-ldl"], capture_output=True, text=True)
        if result.returncode != 0:
            os.unlink(tmp)
            raise KernelBuildError(f"building the KT CPU experts kernel with {cxx} failed:\n{result.stderr[-4000:]}")
        os.replace(tmp, target)
    return _declare(ctypes.CDLL(target))


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, i64, d = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_double
    signatures = {
        "ktc_engine_create": (p, [i, i, i, i, i, i, i, p, p, i, p]),
        "ktc_engine_destroy": (None, [p]),
        "ktc_layer_create": (p, [p, i, p, p, p, p, i, i, i, i]),
        "ktc_layer_uses_bf16_dot": (i, [p]),
        "ktc_layer_uses_int8_dot": (i, [p]),
        "ktc_layer_destroy": (None, [p]),
        "ktc_run": (None, [p]),
        "ktc_enqueue_submit": (i, [p, p]),
        "ktc_enqueue_wait": (i, [p, p]),
        "ktc_stream_write_value": (i, [p, p, i]),
        "ktc_stream_wait_value": (i, [p, p, i]),
        "ktc_engine_stats": (None, [p, ctypes.POINTER(i64)]),
        "ktc_read_seconds": (d, [p, i64, i, i, i]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib
