"""Helpers shared by the OpenAI completions and chat handlers: sampling parameters, finish reasons,
usage and token strings."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sglang.srt.entrypoints.openai.protocol import UsageInfo, _SamplingRequest
from sglang.srt.managers.tokenizer_manager import RequestError


def new_request_id(req: _SamplingRequest) -> str:
    return req.rid if req.rid else uuid.uuid4().hex


def check_common_fields(req: _SamplingRequest) -> None:
    """Refuse what we cannot honour instead of silently ignoring it."""
    if req.logit_bias:
        raise RequestError("logit_bias is not supported by this server")


def build_sampling_params(req: _SamplingRequest, max_new_tokens: Optional[int]) -> Dict[str, Any]:
    """OpenAI names -> SGLang sampling params; unset fields keep the engine's defaults."""
    params = {
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": req.min_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty,
        "repetition_penalty": req.repetition_penalty,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "sampling_seed": req.seed,
        "n": req.n,
        "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "no_stop_trim": req.no_stop_trim,
    }
    return {k: v for k, v in params.items() if v is not None}


def finish_reason(meta: dict) -> Optional[str]:
    """Our finish reason dict -> OpenAI's string ("stop", "length"; "abort" as SGLang reports it)."""
    fr = meta.get("finish_reason")
    if fr is None:
        return None
    return fr.get("type") if fr.get("type") in ("stop", "length", "abort") else "stop"


def usage_of(outputs: Sequence[dict]) -> UsageInfo:
    prompt = sum(o["meta_info"].get("prompt_tokens", 0) for o in outputs)
    completion = sum(o["meta_info"].get("completion_tokens", 0) for o in outputs)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def token_strings(tokenizer, ids: Sequence[int]) -> List[str]:
    """The text of each token on its own (as OpenAI's logprobs show it)."""
    if tokenizer is None:
        return [f"token_id:{t}" for t in ids]
    return [tokenizer.decode([t]) for t in ids]


def output_logprobs(out: dict, start: int = 0) -> Tuple[List[int], List[float]]:
    """(token ids, logprobs) of the output tokens from index `start` on."""
    entries = out["meta_info"].get("output_token_logprobs") or []
    return [e[1] for e in entries[start:]], [e[0] for e in entries[start:]]


def stream_options_usage(req: _SamplingRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)
