"""The body of SGLang's native /generate route, validated by pydantic (messages name the field),
and its conversion to the TokenizerManager's GenerateReqInput.

It accepts upstream SGLang's GenerateReqInput as that defines it, because SGLang's own clients
(bench_serving, the frontend language, the OpenAI adapter) send many of its fields on every request:
- fields we honour are strictly typed and range-checked here;
- fields of features this engine lacks (LoRA, multimodal inputs, hidden states, sessions, PD
  disaggregation, ...) are accepted at their default (null / false / empty) and answered with a
  400 that names the field when set (UNSUPPORTED_FIELDS);
- keys upstream does not define either are ignored, as upstream's dataclass ignores them (logged once
  at debug level, so a typo can still be found).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Dict, List, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError

logger = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 64  # per position; more is a full-vocabulary dump, not a use case
MAX_TOKEN_IDS_LOGPROB = 1024

# Upstream fields whose features this engine does not have -> what the 400 says they are.
UNSUPPORTED_FIELDS = {
    "input_embeds": "input embeddings",
    "image_data": "image inputs",
    "video_data": "video inputs",
    "audio_data": "audio inputs",
    "mm_hashes": "multimodal inputs",
    "mm_content_hashes": "multimodal inputs",
    "modalities": "multimodal inputs",
    "use_audio_in_video": "multimodal inputs",
    "video_config": "multimodal inputs",
    "images_config": "multimodal inputs",
    "max_dynamic_patch": "multimodal inputs",
    "min_dynamic_patch": "multimodal inputs",
    "image_max_dynamic_patch": "multimodal inputs",
    "video_max_dynamic_patch": "multimodal inputs",
    "lora_path": "LoRA adapters",
    "lora_id": "LoRA adapters",
    "custom_logit_processor": "custom logit processors",
    "positional_embed_overrides": "embedding overrides",
    "return_hidden_states": "hidden-state outputs",
    "return_routed_experts": "routed-expert outputs",
    "routed_experts_start_len": "routed-expert outputs",
    "return_indexer_topk": "indexer outputs",
    "return_entropy": "entropy outputs",
    "return_sampling_mask": "sampling-mask outputs",
    "return_flat_raw_top_logprobs": "flat top-logprob arrays",
    "return_flat_raw_top_logprobs_b64": "flat top-logprob arrays",
    "return_bytes": "byte outputs",
    "session_params": "sessions",
    "bootstrap_host": "prefill/decode disaggregation",
    "bootstrap_port": "prefill/decode disaggregation",
    "bootstrap_room": "prefill/decode disaggregation",
    "bootstrap_pair_key": "prefill/decode disaggregation",
    "decode_tp_size": "prefill/decode disaggregation",
    "disagg_prefill_dp_rank": "prefill/decode disaggregation",
    "need_wait_for_mm_inputs": "encoder disaggregation",
    "num_items_assigned": "encoder disaggregation",
    "encoder_urls": "encoder disaggregation",
    "kv_router_hint": "KV routing hints",
    "priority": "priority scheduling",
    "cache_salt": "cache namespaces",
    "extra_key": "cache namespaces",
    "background": "background responses",
    "max_thinking_tokens": "reasoning controls",
    "multi_item_delimiter_indices": "multi-item scoring",
}
# Upstream fields that are accepted and have no effect here, because what they ask for is always true
# (one data-parallel rank, nothing logged per request, no routing) or is only a label.
ACCEPTED_FIELDS = (
    "session_id",
    "log_metrics",
    "no_logs",
    "custom_labels",
    "routing_key",
    "conversation_id",
    "external_trace_header",
    "received_time",
    "http_worker_ipc",
)
_DP_RANK_FIELDS = ("data_parallel_rank", "routed_dp_rank")
_warned_unknown: set = set()


def is_default(value: Any) -> bool:
    """null, false, 0-free empties, or a batch list of those: what clients send for 'not used'."""
    if value is None or value is False or value == "" or value == [] or value == {}:
        return True
    return isinstance(value, list) and all(is_default(v) for v in value)


IntOrList = Union[StrictInt, List[StrictInt]]
BoolOrList = Union[StrictBool, List[StrictBool]]


class GenerateRequest(BaseModel):
    """The /generate body (SGLang's GenerateReqInput); lists make a batch."""

    model_config = ConfigDict(extra="allow")  # unknown keys are kept aside, checked and ignored below

    text: Optional[Union[StrictStr, List[StrictStr]]] = None
    input_ids: Optional[Union[List[StrictInt], List[List[StrictInt]]]] = None
    sampling_params: Optional[Union[Dict[str, Any], List[Dict[str, Any]]]] = None
    rid: Optional[Union[StrictStr, List[StrictStr]]] = None
    return_logprob: Optional[BoolOrList] = None
    logprob_start_len: Optional[IntOrList] = None
    top_logprobs_num: Optional[IntOrList] = None
    token_ids_logprob: Optional[Union[List[StrictInt], List[List[StrictInt]]]] = None
    return_text_in_logprobs: StrictBool = False
    return_prompt_token_ids: StrictBool = False
    stream: StrictBool = False
    # The model thinks first (--reasoning-parser): a constraint applies from the end of its reasoning on.
    require_reasoning: StrictBool = False
    # Accepted, no effect (see ACCEPTED_FIELDS); typed loosely as upstream types them.
    session_id: Optional[StrictStr] = None
    log_metrics: StrictBool = True
    no_logs: StrictBool = False
    custom_labels: Optional[Dict[str, StrictStr]] = None
    routing_key: Optional[StrictStr] = None
    conversation_id: Optional[StrictStr] = None
    external_trace_header: Optional[Dict[str, Any]] = None
    received_time: Optional[float] = None
    http_worker_ipc: Optional[StrictStr] = None
    data_parallel_rank: Optional[StrictInt] = None
    routed_dp_rank: Optional[StrictInt] = None


def check_other_fields(req: GenerateRequest) -> None:
    """Fields of features we lack must be at their default; unknown keys are ignored (logged once)."""
    for name, value in (req.__pydantic_extra__ or {}).items():
        if name in UNSUPPORTED_FIELDS:
            if not is_default(value):
                raise RequestError(
                    f"{name}: {UNSUPPORTED_FIELDS[name]} are not supported by this server (send null or omit it)"
                )
        elif name not in _warned_unknown:
            _warned_unknown.add(name)
            logger.debug("/generate: ignoring the unknown field %r (as upstream SGLang does)", name)
    for name in _DP_RANK_FIELDS:
        value = getattr(req, name)
        if value not in (None, 0):
            raise RequestError(f"{name}: this server has one data-parallel rank (0), got {value}")


def _per_item(req: GenerateRequest, name: str, n: int, is_batch: bool) -> list:
    """A field as one value per batch item: lists must have one entry per item."""
    value = getattr(req, name)
    if is_batch and isinstance(value, list) and (name != "token_ids_logprob" or (value and isinstance(value[0], list))):
        if len(value) != n:
            raise RequestError(f"{name} has {len(value)} entries for a batch of {n}")
        return list(value)
    if not is_batch and isinstance(value, list) and name not in ("token_ids_logprob",):
        raise RequestError(f"{name} may be a list only for a batch")
    return [value] * n


def _check_logprob_args(i: int, top_n: Optional[int], start: Optional[int], ids: Optional[List[int]]) -> None:
    where = "" if i < 0 else f" (batch item {i})"
    if top_n is not None and not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise RequestError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {top_n}{where}")
    if start is not None and start < -1:
        raise RequestError(f"logprob_start_len must be -1 (output tokens only) or >= 0, got {start}{where}")
    if ids is not None and len(ids) > MAX_TOKEN_IDS_LOGPROB:
        raise RequestError(f"token_ids_logprob: at most {MAX_TOKEN_IDS_LOGPROB} token ids{where}")


def to_generate_input(req: GenerateRequest) -> Tuple[GenerateReqInput, List[str]]:
    """-> (GenerateReqInput, rids): every request gets an explicit id so it can be aborted."""
    check_other_fields(req)
    probe = GenerateReqInput(text=req.text, input_ids=req.input_ids)
    is_batch, n = probe.is_batch, probe.batch_size()
    if is_batch:
        if isinstance(req.rid, list):
            if len(req.rid) != n:
                raise RequestError(f"rid has {len(req.rid)} entries for a batch of {n}")
            rids = list(req.rid)
        else:
            base = req.rid or uuid.uuid4().hex
            rids = [f"{base}-{i}" for i in range(n)]
    else:
        if isinstance(req.rid, list):
            raise RequestError("rid may be a list only for a batch")
        rids = [req.rid or uuid.uuid4().hex]
    fields = {
        name: _per_item(req, name, n, is_batch)
        for name in ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob")
    }
    for i in range(n):
        _check_logprob_args(
            i if is_batch else -1,
            fields["top_logprobs_num"][i],
            fields["logprob_start_len"][i],
            fields["token_ids_logprob"][i],
        )
    pick = (lambda values: values) if is_batch else (lambda values: values[0])
    obj = GenerateReqInput(
        text=req.text,
        input_ids=req.input_ids,
        rid=rids if is_batch else rids[0],
        sampling_params=pick(fields["sampling_params"]),
        return_logprob=pick([bool(v) for v in fields["return_logprob"]]),
        logprob_start_len=pick([-1 if v is None else v for v in fields["logprob_start_len"]]),
        top_logprobs_num=pick([v or 0 for v in fields["top_logprobs_num"]]),
        token_ids_logprob=pick(fields["token_ids_logprob"]),
        return_text_in_logprobs=req.return_text_in_logprobs,
        return_prompt_token_ids=req.return_prompt_token_ids,
        stream=req.stream,
        log_metrics=req.log_metrics,
        require_reasoning=req.require_reasoning,
    )
    return obj, rids
