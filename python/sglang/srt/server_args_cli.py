"""argparse definitions for ServerArgs: SGLang's flag names and the choices each flag takes.

Imports nothing of ours: server_args.py imports this module (the choices, add_cli_args) and hands
in the dataclass defaults, so the two never import each other.
"""

from __future__ import annotations

import argparse
from typing import Any, Mapping

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DTYPES = ("auto", "float32", "float16", "bfloat16", "half", "float", "bf16", "fp16", "fp32")
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
QUANTIZATIONS = ("fp8",)  # online: a full-precision checkpoint's dense linear layers, quantized while loading
ATTENTION_BACKENDS = ("torch_native", "triton")
KT_METHODS = ("BF16", "FP8", "FP8_PERCHANNEL", "INT8", "INT4", "MXFP4", "AMXINT4", "AMXINT8", "RAWINT4")
DEFAULT_KT_METHOD = "AMXINT4"
# Upstream's names; function_call_parser.py / reasoning_parser.py hold the parsers (a unit test keeps them equal).
TOOL_CALL_PARSERS = ("qwen25", "llama3", "mistral", "pythonic", "deepseekv3", "glm45", "kimi_k2", "qwen3_coder")
REASONING_PARSERS = ("qwen3", "deepseek-r1", "glm45", "kimi_k2")
GRAMMAR_BACKENDS = ("xgrammar", "llguidance", "none")  # upstream's names


def add_cli_args(parser: argparse.ArgumentParser, defaults: Mapping[str, Any]) -> None:
    """Every ServerArgs flag; `defaults` are the dataclass's (field name -> default)."""

    def _default(name: str) -> Any:
        return defaults[name]

    g = parser.add_argument_group("model")
    g.add_argument(
        "--model-path",
        "--model",
        type=str,
        default=None,
        help="Hugging Face directory, .gguf file, or a built-in name. Default: the built-in SmolLM2-135M-Instruct.",
    )
    g.add_argument("--tokenizer-path", type=str, default=None)
    g.add_argument("--load-format", type=str, default=_default("load_format"), choices=LOAD_FORMATS)
    g.add_argument("--skip-tokenizer-init", action="store_true", help="Take and return token ids only.")
    g.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="Let a tokenizer that ships its own Python code (Kimi-K2's) run it. Models and their configs never "
        "run checkpoint code: our own classes serve them (a Kimi-K2 config loads as DeepSeek-V3's).",
    )
    g.add_argument("--dtype", type=str, default=_default("dtype"), choices=DTYPES)
    g.add_argument("--kv-cache-dtype", type=str, default=_default("kv_cache_dtype"), choices=KV_CACHE_DTYPES)
    g.add_argument(
        "--quantization",
        type=str,
        default=None,
        choices=QUANTIZATIONS,
        help="Quantize the linear layers while loading: fp8 = e4m3 weights with a scale per output channel, "
        "activations scaled per token (dense models).",
    )
    g.add_argument("--context-length", type=int, default=None)
    g.add_argument("--served-model-name", type=str, default=None)
    g.add_argument(
        "--chat-template", type=str, default=None, help="A Jinja chat template file, overriding the tokenizer's."
    )
    g.add_argument("--random-seed", type=int, default=_default("random_seed"))
    g.add_argument(
        "--tool-call-parser",
        type=str,
        default=None,
        choices=TOOL_CALL_PARSERS,
        help="The model's tool-call format: /v1/chat/completions returns its calls as tool_calls.",
    )
    g.add_argument(
        "--reasoning-parser",
        type=str,
        default=None,
        choices=REASONING_PARSERS,
        help="The model's thinking format: /v1/chat/completions returns it as reasoning_content.",
    )
    g.add_argument(
        "--grammar-backend",
        type=str,
        default=_default("grammar_backend"),
        choices=GRAMMAR_BACKENDS,
        help="Constrained decoding (json_schema, regex, ebnf, structural_tag, response_format, required tool calls):"
        " xgrammar, llguidance (the llguidance package; no structural_tag, so no forced tool calls), or none to"
        " refuse such requests with a 400.",
    )

    g = parser.add_argument_group("http")
    g.add_argument("--host", type=str, default=_default("host"))
    g.add_argument("--port", type=int, default=_default("port"))
    g.add_argument("--api-key", type=str, default=None, help="Require `Authorization: Bearer <key>` on every request.")
    g.add_argument(
        "--log-level", type=str, default=_default("log_level"), choices=["debug", "info", "warning", "error"]
    )
    g.add_argument(
        "--log-requests",
        action="store_true",
        help="Log each request when it arrives (id, prompt tokens, sampling parameters) and when it ends (finish "
        "reason, token counts, latency); never its text.",
    )
    g.add_argument(
        "--skip-server-warmup",
        action="store_true",
        help="Announce readiness without the one-token warm-up generation (the first request pays its one-time costs).",
    )
    g.add_argument(
        "--enable-metrics",
        action="store_true",
        help="Prometheus metrics at /metrics: always served here; accepted as SGLang's launch lines pass it.",
    )

    g = parser.add_argument_group("memory and scheduling")
    g.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="Fraction of device memory for weights + KV pool. Default: derived from the device size.",
    )
    g.add_argument("--max-total-tokens", type=int, default=None, help="Cap on the KV pool's token count.")
    g.add_argument("--max-running-requests", type=int, default=None)
    g.add_argument("--max-prefill-tokens", type=int, default=_default("max_prefill_tokens"))
    g.add_argument(
        "--chunked-prefill-size", type=int, default=None, help="Tokens per prefill chunk; -1 disables chunking."
    )
    g.add_argument("--page-size", type=int, default=_default("page_size"))
    g.add_argument("--schedule-policy", type=str, default=_default("schedule_policy"), choices=["fcfs", "lpm"])
    g.add_argument("--disable-radix-cache", action="store_true")
    g.add_argument(
        "--swa-full-tokens-ratio",
        type=float,
        default=_default("swa_full_tokens_ratio"),
        help="Sliding-window layers' KV pool, in tokens per token of the full-attention layers' pool (0, 1].",
    )
    g.add_argument(
        "--disable-hybrid-swa-memory",
        action="store_true",
        help="Keep every token of sliding-window layers in one pool with the others (no separate window pool).",
    )
    g.add_argument("--stream-interval", type=int, default=_default("stream_interval"))
    g.add_argument(
        "--disable-overlap-schedule",
        action="store_true",
        help="Run each batch's result processing before the next batch is launched (overlap is on by default).",
    )
    g.add_argument(
        "--enable-mixed-chunk",
        action="store_true",
        help="Running requests take their decode step inside prefill batches instead of waiting for them.",
    )

    g = parser.add_argument_group("runtime")
    g.add_argument("--device", type=str, default=None, choices=["cpu", "cuda"])
    g.add_argument("--tp-size", "--tp", type=int, default=_default("tp_size"))
    g.add_argument(
        "--dp-size", "--dp", type=int, default=_default("dp_size"), help="Accepted at 1 (replicas: sglang-router)."
    )
    g.add_argument("--nnodes", type=int, default=_default("nnodes"))
    g.add_argument("--node-rank", type=int, default=_default("node_rank"))
    g.add_argument("--dist-init-addr", type=str, default=None, help="host:port of rank 0's rendezvous.")
    g.add_argument("--base-gpu-id", type=int, default=_default("base_gpu_id"))
    g.add_argument("--attention-backend", type=str, default=None, choices=ATTENTION_BACKENDS)
    g.add_argument("--cuda-graph-max-bs", type=int, default=None)
    g.add_argument("--cuda-graph-bs", type=int, nargs="+", default=None)
    g.add_argument("--disable-cuda-graph", action="store_true")

    g = parser.add_argument_group("ktransformers hybrid MoE")
    g.add_argument("--kt-weight-path", type=str, default=None)
    g.add_argument(
        "--kt-method",
        type=str.upper,
        default=None,
        choices=KT_METHODS,
        help=f"The CPU experts' format (default {DEFAULT_KT_METHOD}).",
    )
    g.add_argument(
        "--kt-cpuinfer",
        type=int,
        default=None,
        help="CPU threads computing experts, per tensor-parallel rank (default: the usable CPUs / --tp-size).",
    )
    g.add_argument(
        "--kt-threadpool-count",
        type=int,
        default=_default("kt_threadpool_count"),
        help="CPU expert thread pools (kt-kernel: one per NUMA node). The built-in backend runs one pool.",
    )
    g.add_argument("--kt-num-gpu-experts", type=int, default=None, help="Experts per MoE layer kept on the GPU.")
    g.add_argument(
        "--kt-max-deferred-experts-per-token",
        type=int,
        default=None,
        help="kt-kernel's deferred experts (added into the next layer); the built-in backend defers none (0).",
    )
    g.add_argument(
        "--kt-gpu-prefill-token-threshold",
        type=int,
        default=None,
        help="Prefill batches of at least this many tokens run their MoE fully on the GPU.",
    )
