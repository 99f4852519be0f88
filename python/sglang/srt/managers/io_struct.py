"""Messages between the TokenizerManager, Scheduler and DetokenizerManager (pickled over ZeroMQ)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Union


@dataclass
class GenerateReqInput:
    """The /generate request (SGLang's native shape). Exactly one of text / input_ids."""

    text: Optional[Union[str, List[str]]] = None
    input_ids: Optional[Union[List[int], List[List[int]]]] = None
    sampling_params: Optional[Union[dict, List[dict]]] = None
    rid: Optional[Union[str, List[str]]] = None
    return_logprob: Union[bool, List[bool]] = False
    stream: bool = False

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    def batch_size(self) -> int:
        if not self.is_batch:
            return 1
        return len(self.text) if self.text is not None else len(self.input_ids)

    def item(self, i: int) -> "GenerateReqInput":
        """The i-th single request of a batch."""
        pick = lambda v: v[i] if isinstance(v, list) else v  # noqa: E731
        return GenerateReqInput(
            text=self.text[i] if self.text is not None else None,
            input_ids=self.input_ids[i] if self.input_ids is not None else None,
            sampling_params=pick(self.sampling_params),
            rid=self.rid[i] if isinstance(self.rid, list) else (f"{self.rid}-{i}" if self.rid else None),
            return_logprob=pick(self.return_logprob),
            stream=self.stream,
        )


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: str
    input_ids: List[int]
    sampling_params: Any  # SamplingParams
    return_logprob: bool
    stream: bool


@dataclass
class AbortReq:
    rid: str
    message: str = "aborted"
    status_code: int = 499


@dataclass
class FlushCacheReq:
    pass


@dataclass
class FlushCacheReqOutput:
    success: bool
    message: str = ""


@dataclass
class SchedulerStats:
    """What /metrics and /server_info show of the scheduler's state."""

    num_running_reqs: int = 0
    num_queued_reqs: int = 0
    token_usage: float = 0.0
    num_used_tokens: int = 0
    max_total_num_tokens: int = 0
    cached_tokens_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    gen_throughput: float = 0.0
    num_retractions: int = 0


@dataclass
class BatchTokenIDOut:
    """Scheduler -> detokenizer: new output tokens of some requests."""

    rids: List[str]
    output_ids: List[List[int]]  # only the tokens not sent before
    finished_reasons: List[Optional[dict]]
    prompt_tokens: List[int]
    completion_tokens: List[int]
    cached_tokens: List[int]
    output_token_logprobs: List[List[float]]  # aligned with output_ids
    skip_special_tokens: List[bool]
    spaces_between_special_tokens: List[bool]
    no_stop_trim: List[bool]
    stop_str_max_len: List[int]  # the detokenizer holds back this many characters - 1 while streaming
    # time.monotonic() of each request's first token in the scheduler (CLOCK_MONOTONIC is one clock for
    # every process of the host), so TTFT is right even when tokens are sent only at the end.
    first_token_times: List[Optional[float]]


@dataclass
class BatchStrOut:
    """Detokenizer -> tokenizer manager: new text (incremental) of some requests."""

    rids: List[str]
    output_strs: List[str]  # text added since the last message for this request
    output_ids: List[List[int]]
    finished_reasons: List[Optional[dict]]
    prompt_tokens: List[int]
    completion_tokens: List[int]
    cached_tokens: List[int]
    output_token_logprobs: List[List[float]]
    first_token_times: List[Optional[float]]


@dataclass
class SchedulerFailed:
    """Sent when a scheduler dies: the launcher or tokenizer manager turns it into errors and an exit."""

    message: str
