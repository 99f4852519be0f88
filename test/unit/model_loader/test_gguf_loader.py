from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="per-commit-cpu")

# GGUF loading: the Q/K un-permutation is the exact inverse of llama.cpp's convert-time permute,
# names map to Hugging Face's, and a synthetic GGUF written the way llama.cpp writes one (permuted
# Q/K, F32 and Q8_0 tensors) loads back into the original HF weights, as transformers also reads it.

import math
import os

import gguf
import numpy as np
import pytest
import torch

from sglang.srt.model_loader.gguf_config import config_from_gguf, open_gguf
from sglang.srt.model_loader.gguf_loader import gguf_weights_iterator, hf_name, undo_rotary_permute
from sglang.test.runners import make_tiny_hf_model, smollm2_gguf_path


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv=None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in behaviour."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize("n_head,head_dim,cols", [(4, 8, 16), (9, 64, 5), (3, 64, 1), (1, 2, 3)])
def test_undo_rotary_permute_inverts_llama_cpp(n_head, head_dim, cols):
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, cols)).astype(np.float32)
    permuted = llama_cpp_permute(w, n_head)
    if head_dim > 2:
        assert not np.array_equal(permuted, w)
    assert np.array_equal(undo_rotary_permute(permuted, n_head), w)
    # And 1-D (a bias), which llama.cpp permutes the same way.
    b = w[:, 0].copy()
    assert np.array_equal(undo_rotary_permute(llama_cpp_permute(b, n_head), n_head), b)


def test_undo_rotary_permute_gqa_uses_kv_heads():
    n_head, n_kv, d, cols = 8, 2, 16, 12
    k = np.arange(n_kv * d * cols, dtype=np.float32).reshape(n_kv * d, cols)
    assert np.array_equal(undo_rotary_permute(llama_cpp_permute(k, n_head, n_kv), n_kv), k)


def test_undo_rotary_permute_restores_rotate_half_layout():
    # One head, head_dim 8: llama.cpp interleaves the halves (0,4,1,5,2,6,3,7); we restore 0..7.
    rows = np.arange(8, dtype=np.float32)[:, None]
    assert llama_cpp_permute(rows, 1)[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert undo_rotary_permute(llama_cpp_permute(rows, 1), 1)[:, 0].tolist() == list(range(8))


@pytest.mark.parametrize(
    "gguf_name,hf",
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
        ("blk.12.ffn_norm.weight", "model.layers.12.post_attention_layernorm.weight"),
        ("blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"),
        ("blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias"),
        ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.1.attn_q_norm.weight", "model.layers.1.self_attn.q_norm.weight"),
        ("blk.1.attn_k_norm.weight", "model.layers.1.self_attn.k_norm.weight"),
        ("blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"),
        ("blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"),
        ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
        ("blk.2.ffn_gate_inp.weight", "model.layers.2.mlp.gate.weight"),
        ("rope_freqs.weight", None),
        ("blk.0.unknown_part.weight", None),
    ],
)
def test_name_mapping(gguf_name, hf):
    assert hf_name(gguf_name) == hf


def llama_cpp_rope_factors(config) -> np.ndarray:
    """convert_hf_to_gguf.py's Llama-3.1 `rope_freqs.weight`: per rotary pair, the factor its base inverse
    frequency is divided by (1 for short wavelengths, `factor` for long ones, a smooth blend between)."""
    rope = config.rope_parameters
    head_dim = config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_ctx = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _write_gguf(hf_dir: str, path: str, quantize_mlp: bool, extra_metadata=None) -> dict:
    """Write the tiny HF llama, qwen2 or qwen3 in `hf_dir` as llama.cpp's converter would (Q/K rows permuted for
    llama only, its rope scaling as metadata, Llama 3's as rope_freqs.weight); `extra_metadata(writer)` adds more
    keys. Returns the HF state dict."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(hf_dir)
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    arch = cfg.model_type
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rope = cfg.rope_parameters or {}
    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_factors(cfg))
    elif rope.get("rope_type") in ("linear", "yarn"):  # convert_hf_to_gguf.py's keys
        w.add_rope_scaling_type(gguf.RopeScalingType(rope["rope_type"]))
        w.add_rope_scaling_factor(rope["factor"])
        if rope["rope_type"] == "yarn":
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if extra_metadata is not None:
        extra_metadata(w)
    to_gguf = {
        v: k for k, v in {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}.items()
    }
    parts = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, t in sd.items():
        arr = t.float().numpy()
        base, kind = name.rsplit(".", 1)
        if base in to_gguf:
            gname = f"{to_gguf[base]}.{kind}"
        else:
            _, _, layer, rest = base.split(".", 3)
            gname = f"blk.{layer}.{parts[rest]}.{kind}"
        if arch == "llama" and rest_is(name, "q_proj"):
            arr = llama_cpp_permute(arr, cfg.num_attention_heads, cfg.num_attention_heads)
        elif arch == "llama" and rest_is(name, "k_proj"):
            arr = llama_cpp_permute(arr, cfg.num_attention_heads, cfg.num_key_value_heads)
        if quantize_mlp and "mlp" in name:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(gname, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sd


def rest_is(name: str, proj: str) -> bool:
    return name.endswith(f"{proj}.weight")


@pytest.fixture(scope="module")
def tiny_llama_gguf(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny_llama"))
    make_tiny_hf_model("llama", d)
    path = os.path.join(d, "tiny-f32.gguf")
    sd = _write_gguf(d, path, quantize_mlp=False)
    qpath = os.path.join(str(tmp_path_factory.mktemp("tiny_llama_q8")), "tiny-q8.gguf")
    _write_gguf(d, qpath, quantize_mlp=True)
    return d, path, qpath, sd


def test_synthetic_gguf_loads_back_to_hf_weights(tiny_llama_gguf):
    _, path, _, sd = tiny_llama_gguf
    got = dict(gguf_weights_iterator(path, show_progress=False))
    assert set(got) == set(sd)
    for name, t in sd.items():
        assert torch.equal(got[name], t.float()), name


def test_quantized_tensors_dequantize_close(tiny_llama_gguf):
    _, _, qpath, sd = tiny_llama_gguf
    got = dict(gguf_weights_iterator(qpath, show_progress=False))
    for name, t in sd.items():
        if "mlp" in name:
            assert got[name].shape == t.shape
            assert not torch.equal(got[name], t)  # really went through Q8_0
            assert torch.allclose(got[name], t, atol=t.abs().max().item() / 100), name
        else:
            assert torch.equal(got[name], t), name


def test_config_from_synthetic_gguf(tiny_llama_gguf):
    d, path, _, _ = tiny_llama_gguf
    from transformers import AutoConfig

    ref = AutoConfig.from_pretrained(d)
    cfg = config_from_gguf(path)
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
        "rms_norm_eps",
    ):
        assert getattr(cfg, key) == pytest.approx(getattr(ref, key)), key
    assert cfg.architectures == ["LlamaForCausalLM"]
    assert cfg.tie_word_embeddings is False  # output.weight is present
    assert cfg.eos_token_id == 2 and cfg.bos_token_id == 1


def test_transformers_reads_our_synthetic_gguf_identically(tiny_llama_gguf):
    """transformers' GGUF loader undoes the permutation its own way; both must give the same weights."""
    from transformers import AutoModelForCausalLM

    _, path, _, sd = tiny_llama_gguf
    hf = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    hf_sd = hf.state_dict()
    ours = dict(gguf_weights_iterator(path, show_progress=False))
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.2.self_attn.k_proj.weight"):
        assert torch.equal(hf_sd[name], ours[name]), name


def test_smollm2_gguf_config():
    path = smollm2_gguf_path()
    cfg = config_from_gguf(path)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (576, 30, 9, 3)
    assert cfg.vocab_size == 49152 and cfg.intermediate_size == 1536
    assert cfg.tie_word_embeddings is True  # SmolLM2 has no output.weight
    assert cfg.head_dim == 64
    names = {t.name for t in open_gguf(path).tensors}
    assert "output.weight" not in names and "blk.29.attn_q.weight" in names
    assert all(hf_name(n) is not None for n in names)


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,  # tiny head_dim 16: long, short and blended wavelengths all occur
}


YARN_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}


def tiny_gguf_of(d: str, rope=None, extra_metadata=None, arch: str = "llama") -> str:
    """A tiny transformers-written `arch` model in `d` (with `rope` as its rope parameters) and its GGUF there."""
    make_tiny_hf_model(arch, d, **({"rope_parameters": rope} if rope else {}))
    path = os.path.join(d, "tiny-f32.gguf")
    _write_gguf(d, path, quantize_mlp=False, extra_metadata=extra_metadata)
    return path


def assert_transformers_frequencies(config, hf_dir: str) -> None:
    """The GGUF's config gives the inverse frequencies and attention scaling transformers computes from the HF
    config it was converted from, and they differ from unscaled rope's (the scaling is not a no-op)."""
    from transformers import AutoConfig

    from sglang.srt.layers.rotary_embedding import compute_inv_freq

    ours, our_scale = compute_inv_freq(config, 16)
    ref, ref_scale = compute_inv_freq(AutoConfig.from_pretrained(hf_dir), 16)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)
    assert our_scale == pytest.approx(ref_scale)
    plain, _ = compute_inv_freq(
        AutoConfig.from_pretrained(hf_dir, rope_parameters={"rope_type": "default", "rope_theta": 1e4}), 16
    )
    assert not torch.allclose(ours, plain)


@pytest.fixture(scope="module")
def llama31_gguf(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny_llama31"))
    return d, tiny_gguf_of(d, LLAMA3_ROPE)


def test_rope_freqs_are_transformers_llama3_frequencies(llama31_gguf):
    d, path = llama31_gguf
    assert "rope_freqs.weight" in {t.name for t in open_gguf(path).tensors}
    config = config_from_gguf(path)
    factors = np.array(config.rope_freq_factors)
    assert (factors == 1).any() and (factors == 8).any() and ((factors > 1) & (factors < 8)).any()
    assert_transformers_frequencies(config, d)  # transformers' llama3 initialiser
    assert "rope_freqs.weight" not in dict(gguf_weights_iterator(path, show_progress=False))


@pytest.mark.parametrize("rope", [LINEAR_ROPE, YARN_ROPE], ids=["linear", "yarn"])
def test_gguf_rope_scaling_gives_transformers_frequencies(tmp_path, rope):
    """`{arch}.rope.scaling.*` becomes the config's rope scaling (before: read as no scaling at all)."""
    config = config_from_gguf(tiny_gguf_of(str(tmp_path), rope))
    assert config.rope_parameters["rope_type"] == rope["rope_type"]
    assert_transformers_frequencies(config, str(tmp_path))


@pytest.mark.parametrize(
    "arch,rope",
    [("llama", LLAMA3_ROPE), ("llama", YARN_ROPE), ("qwen2", YARN_ROPE), ("qwen3", YARN_ROPE)],
    ids=["llama-llama3", "llama-yarn", "qwen2-yarn", "qwen3-yarn"],
)
def test_scaled_rope_gguf_generates_like_transformers(tmp_path, arch, rope):
    """Every GGUF architecture the rope metadata reaches: Llama 3's rope_freqs.weight and yarn's scaling keys (Qwen
    2.5's YaRN GGUFs), prompts past the original context (256 and 64 positions): greedy tokens equal to
    transformers on the HF directory."""
    import random

    from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler

    d = str(tmp_path)
    path = tiny_gguf_of(d, rope, arch=arch)
    assert config_from_gguf(path).rope_parameters["rope_type"] == ("default" if rope is LLAMA3_ROPE else "yarn")
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (4, 60, 300)]
    ref = hf_greedy(d, prompts, 12)
    sched = make_scheduler(reuse_model=False, model_path=path, skip_tokenizer_init=True, max_total_tokens=2048)
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(12))] == ref


def test_rotary_tables_are_not_shared_across_frequency_factors(llama31_gguf):
    """get_rope shares one table per geometry: a GGUF's factors are part of it (a plain config of the same
    rope_theta and head size built first must not hand its table to the Llama-3.1 one)."""
    from sglang.srt.layers.rotary_embedding import get_rope

    _, path = llama31_gguf
    config = config_from_gguf(path)
    plain = config_from_gguf(path)
    plain.rope_freq_factors = None
    first = get_rope(plain, 16, 64, torch.float32)
    scaled = get_rope(config, 16, 64, torch.float32)
    assert scaled is not first and not torch.equal(scaled.cos_cache, first.cos_cache)


@pytest.mark.parametrize(
    "add,key",
    [
        (lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE), "llama.rope.scaling.type"),
        (lambda w: w.add_rope_dimension_count(8), "llama.rope.dimension_count"),  # half of each 16-wide head
        (lambda w: w.add_sliding_window(32), "llama.attention.sliding_window"),
        (lambda w: w.add_float32("llama.rope.scaling.yarn_log_multiplier", 0.1), "yarn_log_multiplier"),
        (lambda w: w.add_float32("llama.rope.scaling.attn_factor", 0.5), "llama.rope.scaling.attn_factor"),
    ],
    ids=["longrope", "partial-rotary", "sliding-window", "yarn-log-multiplier", "attn-factor"],
)
def test_gguf_metadata_we_would_not_honour_is_refused_by_key(tmp_path, capsys, add, key):
    """Before any tensor is read; at start-up a CLI error (exit 2) naming --model-path and the key."""
    from sglang.srt.configs.engine_config import prepare_engine_config

    path = tiny_gguf_of(str(tmp_path), extra_metadata=add)
    with pytest.raises(ValueError, match=key):
        config_from_gguf(path)
    with pytest.raises(SystemExit) as e:
        prepare_engine_config(["--device", "cpu", "--model-path", path, "--skip-tokenizer-init"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--model-path {path}: GGUF" in err and key in err


def test_gguf_neutral_rope_metadata_passes(tmp_path):
    """What llama.cpp's converter writes for a plain model (the rotary width of the whole head, scaling none, an
    attention factor of 1) reads as no scaling."""

    def neutral(w):
        w.add_rope_dimension_count(16)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        w.add_float32("llama.rope.scaling.attn_factor", 1.0)

    path = tiny_gguf_of(str(tmp_path), extra_metadata=neutral)
    assert config_from_gguf(path).rope_parameters["rope_type"] == "default"
