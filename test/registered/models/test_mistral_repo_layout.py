from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# A Mistral Hub repo: sharded HF safetensors with model.safetensors.index.json, and beside them
# consolidated.safetensors (the same weights under Mistral's own names). Only the shards the index names are
# read: the model loads and generates exactly as transformers does; a shard the index names but that is
# missing is an error naming it.

import json
import os
import random

import pytest
import torch
from safetensors.torch import save_file

from sglang.srt.model_loader.weight_utils import INDEX_FILE, checkpoint_files
from sglang.test.runners import TINY_CONFIGS, greedy_params, hf_greedy, make_scheduler, run_scheduler


@pytest.fixture(scope="module")
def mistral_repo(tmp_path_factory):
    from transformers import AutoModelForCausalLM, MistralConfig

    d = str(tmp_path_factory.mktemp("mistral-repo"))
    base = {k: v for k, v in TINY_CONFIGS["llama"].items() if k != "architectures"}
    config = MistralConfig(**base, sliding_window=None, initializer_range=0.08, architectures=["MistralForCausalLM"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(d, max_shard_size="200KB")  # several shards and the index
    # Mistral's consolidated format: other names (layers.0.attention.wq.weight, ...), which no HF parameter has.
    native = {
        name.replace("model.", "").replace("self_attn.q_proj", "attention.wq"): t.clone()
        for name, t in model.state_dict().items()
    }
    save_file(native, os.path.join(d, "consolidated.safetensors"))
    return d


def test_only_indexed_shards_are_read(mistral_repo):
    files = [os.path.basename(f) for f in checkpoint_files(mistral_repo)]
    with open(os.path.join(mistral_repo, INDEX_FILE)) as f:
        assert set(files) == set(json.load(f)["weight_map"].values())
    assert len(files) > 1 and "consolidated.safetensors" not in files


def test_mistral_repo_generates_like_transformers(mistral_repo):
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (3, 25)]
    ref = hf_greedy(mistral_repo, prompts, 12)
    sched = make_scheduler(reuse_model=False, model_path=mistral_repo, skip_tokenizer_init=True, max_total_tokens=1024)
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(12))] == ref


def test_missing_indexed_shard_is_named(tmp_path):
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"a.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
        checkpoint_files(str(tmp_path))
