"""Shared pytest set-up: without a GPU, triton kernels run in the interpreter on CPU tensors."""

import os

import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit kernel is defined (module import time).
    os.environ.setdefault("TRITON_INTERPRET", "1")
