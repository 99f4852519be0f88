"""Iterators over checkpoint tensors: (name, tensor) pairs in Hugging Face naming."""

from __future__ import annotations

import glob
import os
from typing import Iterator, Tuple

import torch
from safetensors import safe_open
from tqdm.auto import tqdm


def safetensors_weights_iterator(directory: str, show_progress: bool = True) -> Iterator[Tuple[str, torch.Tensor]]:
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    for path in tqdm(files, desc="Loading safetensors checkpoint shards", disable=not show_progress or len(files) < 2):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
