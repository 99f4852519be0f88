"""The body of SGLang's native /generate route, validated by pydantic (messages name the field),
and its conversion to the TokenizerManager's GenerateReqInput."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError


class GenerateRequest(BaseModel):
    """The /generate body (SGLang's GenerateReqInput); lists make a batch."""

    model_config = ConfigDict(extra="forbid")

    text: Optional[Union[str, List[str]]] = None
    input_ids: Optional[Union[List[StrictInt], List[List[StrictInt]]]] = None
    sampling_params: Optional[Union[Dict[str, Any], List[Dict[str, Any]]]] = None
    rid: Optional[Union[str, List[str]]] = None
    return_logprob: Union[StrictBool, List[StrictBool]] = False
    stream: StrictBool = False
    # SGLang fields with a fixed meaning here: logprobs are of output tokens, sampled token only.
    return_text_in_logprobs: StrictBool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0


def to_generate_input(req: GenerateRequest) -> Tuple[GenerateReqInput, List[str]]:
    """-> (GenerateReqInput, rids): every request gets an explicit id so it can be aborted."""
    if req.top_logprobs_num:
        raise RequestError("top_logprobs_num is not supported by this server (use 0)")
    obj = GenerateReqInput(
        text=req.text, input_ids=req.input_ids, sampling_params=req.sampling_params, rid=req.rid,
        return_logprob=req.return_logprob, stream=req.stream,
    )
    if obj.is_batch:
        n = obj.batch_size()
        if isinstance(req.rid, list):
            if len(req.rid) != n:
                raise RequestError(f"rid has {len(req.rid)} entries for a batch of {n}")
            rids = list(req.rid)
        else:
            base = req.rid or uuid.uuid4().hex
            rids = [f"{base}-{i}" for i in range(n)]
        for name in ("sampling_params", "return_logprob"):
            value = getattr(req, name)
            if isinstance(value, list) and len(value) != n:
                raise RequestError(f"{name} has {len(value)} entries for a batch of {n}")
    else:
        if isinstance(req.rid, list) or isinstance(req.sampling_params, list) or isinstance(req.return_logprob, list):
            raise RequestError("rid, sampling_params and return_logprob may be lists only for a batch")
        rids = [req.rid or uuid.uuid4().hex]
    obj.rid = rids if obj.is_batch else rids[0]
    return obj, rids
