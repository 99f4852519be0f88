"""Iterators over checkpoint tensors: (name, tensor) pairs in Hugging Face naming."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator, List, Tuple

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

INDEX_FILE = "model.safetensors.index.json"


def checkpoint_files(directory: str) -> List[str]:
    """The safetensors files holding the model: the shards `model.safetensors.index.json` names when it is
    there (a Mistral repo also ships `consolidated.safetensors`, the same weights under Mistral's own names,
    which must not be read too), else every `*.safetensors` in the directory."""
    index = os.path.join(directory, INDEX_FILE)
    if not os.path.isfile(index):
        files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {directory}")
        return files
    with open(index) as f:
        weight_map = json.load(f).get("weight_map") or {}
    if not weight_map:
        raise ValueError(f"{index} has no weight_map")
    files = [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]
    missing = [os.path.basename(f) for f in files if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"{index} names shards that are not in {directory}: {missing}")
    return files


def safetensors_weights_iterator(directory: str, show_progress: bool = True) -> Iterator[Tuple[str, torch.Tensor]]:
    files = checkpoint_files(directory)
    for path in tqdm(files, desc="Loading safetensors checkpoint shards", disable=not show_progress or len(files) < 2):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
