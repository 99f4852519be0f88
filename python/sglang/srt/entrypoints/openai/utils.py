"""Helpers shared by the OpenAI completions and chat handlers: sampling parameters, finish reasons,
usage and token strings."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, AsyncGenerator, Callable, Dict, List, Optional, Sequence, Tuple

from sglang.srt.constrained.grammar_key import GRAMMAR_KINDS
from sglang.srt.entrypoints.openai.protocol import UsageInfo, _SamplingRequest
from sglang.srt.managers.tokenizer_manager import RequestError
from sglang.srt.sampling.sampling_params import SamplingParams, SamplingParamsError


def new_request_id(req: _SamplingRequest) -> str:
    return req.rid if req.rid else uuid.uuid4().hex


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
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "logit_bias": req.logit_bias,
        "regex": req.regex,
        "ebnf": req.ebnf,
        "json_schema": req.json_schema,
        "structural_tag": req.structural_tag,
        "stop_regex": req.stop_regex,
        "custom_params": req.custom_params,
    }
    return {k: v for k, v in params.items() if v is not None}


# The token limits: their OpenAI names differ from the sampling keys, which other messages name too
# ("prompt (N tokens) + max_new_tokens (M) exceeds the context length", "[0, max_new_tokens]").
TOKEN_LIMIT_KEYS = ("max_new_tokens", "min_new_tokens")


def token_limit_origin(max_field: str) -> Dict[str, str]:
    """`origin` entries for the token limits: max_new_tokens from `max_field` (max_tokens or
    max_completion_tokens), min_new_tokens from min_tokens."""
    return {"max_new_tokens": max_field, "min_new_tokens": "min_tokens"}


def check_sampling_params(params: Dict[str, Any], origin: Dict[str, str]) -> None:
    """Validate the sampling parameters now, so that an error names the OpenAI field a key came from
    (`origin`: sampling key -> request field, e.g. json_schema -> response_format)."""
    try:
        SamplingParams.from_dict(params)
    except SamplingParamsError as e:
        raise RequestError(name_origin(str(e), origin)) from None


def name_origin(message: str, origin: Dict[str, str]) -> str:
    """An error about sampling key `key` restated with the request field it came from (`origin`); a token
    limit named further on in the message is named as the request named it."""
    head, rest = "", message
    for key, field in origin.items():
        if message.startswith(f"{key}:") or message.startswith(f"{key} "):
            head, rest = f"{field} (as sampling parameter {key})", message[len(key) :]
            break
    for key in TOKEN_LIMIT_KEYS:
        if key in origin:
            rest = re.sub(rf"\b{key}\b", origin[key], rest)
    return head + rest


def with_origin(e: RequestError, origin: Dict[str, str]) -> RequestError:
    """A refusal from the engine (e.g. a grammar that does not compile) naming the request's own field."""
    return RequestError(name_origin(e.message, origin), e.status_code)


async def renamed_errors(
    agen: AsyncGenerator[dict, None], rename: Callable[[RequestError], RequestError]
) -> AsyncGenerator[dict, None]:
    """`agen`'s outputs; a refusal that comes after the first output (a constraint's dead end, mid-stream) is
    restated by `rename` (e.g. with_origin), as a refusal before the first output is."""
    try:
        async for out in agen:
            yield out
    except RequestError as e:
        raise rename(e) from None
    finally:
        await agen.aclose()


def finish_reason(meta: dict) -> Optional[str]:
    """Our finish reason dict -> OpenAI's string ("stop", "length"; "abort" as SGLang reports it)."""
    fr = meta.get("finish_reason")
    if fr is None:
        return None
    return fr.get("type") if fr.get("type") in ("stop", "length", "abort") else "stop"


def usage_of(outputs: Sequence[dict], samples_per_prompt: int = 1) -> UsageInfo:
    """Token counts as OpenAI reports them: each prompt once, however many choices it has."""
    prompt = sum(o["meta_info"].get("prompt_tokens", 0) for o in outputs[:: max(samples_per_prompt, 1)])
    completion = sum(o["meta_info"].get("completion_tokens", 0) for o in outputs)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


Entry = List[Any]  # SGLang's (logprob, token_id, text) triple


def entry_text(entry: Entry) -> str:
    """The token's text, as OpenAI's logprobs show it (`token_id:N` without a tokenizer, as vLLM does)."""
    return entry[2] if entry[2] is not None else f"token_id:{entry[1]}"


def output_logprob_entries(out: dict, start: int = 0) -> Tuple[List[Entry], List[List[Entry]]]:
    """The output tokens' (logprob, id, text) entries from index `start` on, and their top-k lists
    (empty lists when no top-k was asked for)."""
    meta = out["meta_info"]
    entries = (meta.get("output_token_logprobs") or [])[start:]
    tops = (meta.get("output_top_logprobs") or [[] for _ in range(start + len(entries))])[start:]
    return entries, tops


def prompt_logprob_entries(out: dict) -> Tuple[List[Entry], List[Optional[List[Entry]]]]:
    meta = out["meta_info"]
    entries = meta.get("input_token_logprobs") or []
    return entries, meta.get("input_top_logprobs") or [None] * len(entries)


def stream_options_usage(req: _SamplingRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def add_constraint(params: Dict[str, Any], key: str, value: str, field: str, origin: Dict[str, str]) -> None:
    """Set constraint `key` (from request field `field`) in the sampling parameters; a 400 when the request
    also sets another constraint (only one grammar applies)."""
    clash = [k for k in GRAMMAR_KINDS if params.get(k) is not None]
    if clash:
        raise RequestError(f"{field}: give either {field} or {clash[0]}, not both")
    params[key] = value
    origin[key] = field


def refuse_constraints_when_off(params: Dict[str, Any], origin: Dict[str, str], backend: str) -> None:
    """--grammar-backend none: a constraint is a 400 naming the field it came from."""
    used = [k for k in GRAMMAR_KINDS if params.get(k) is not None]
    if used and backend == "none":
        field = origin.get(used[0], used[0])
        raise RequestError(f"{field}: needs constrained decoding, which is off on this server (--grammar-backend none)")


def response_format_constraint(response_format: Optional[Dict[str, Any]]) -> Optional[Tuple[str, str]]:
    """OpenAI's response_format -> the SGLang sampling key that enforces it and its value, as upstream
    maps it: json_object -> a JSON-object schema, json_schema -> its schema, structural_tag -> itself."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise RequestError("response_format.json_schema: must be an object with the schema under `schema`")
        schema = spec.get("schema", spec.get("schema_"))
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema: must be a JSON schema object")
        return "json_schema", json.dumps(schema)
    if kind == "structural_tag":
        return "structural_tag", json.dumps({k: v for k, v in response_format.items() if k != "type"})
    raise RequestError(
        f"response_format.type: must be one of text, json_object, json_schema, structural_tag, got {kind!r}"
    )
