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
    # Logprobs as SGLang returns them: of input tokens from logprob_start_len (-1: output tokens only),
    # the top_logprobs_num most likely tokens at each position, and those of token_ids_logprob.
    logprob_start_len: Union[int, List[int]] = -1
    top_logprobs_num: Union[int, List[int]] = 0
    token_ids_logprob: Optional[Union[List[int], List[List[int]]]] = None
    return_text_in_logprobs: bool = False
    return_prompt_token_ids: bool = False
    log_metrics: bool = True  # false for internal requests (health checks, warm-up)
    # The model thinks before answering (upstream's field; the chat endpoints set it from --reasoning-parser):
    # a constraint then applies from the end of the reasoning on.
    require_reasoning: bool = False

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
        ids_lp = self.token_ids_logprob  # one list for every item, or a list per item
        if ids_lp is not None and ids_lp and not isinstance(ids_lp[0], int):
            ids_lp = ids_lp[i]
        return GenerateReqInput(
            text=self.text[i] if self.text is not None else None,
            input_ids=self.input_ids[i] if self.input_ids is not None else None,
            sampling_params=pick(self.sampling_params),
            rid=self.rid[i] if isinstance(self.rid, list) else (f"{self.rid}-{i}" if self.rid else None),
            return_logprob=pick(self.return_logprob),
            stream=self.stream,
            logprob_start_len=pick(self.logprob_start_len),
            top_logprobs_num=pick(self.top_logprobs_num),
            token_ids_logprob=ids_lp,
            return_text_in_logprobs=self.return_text_in_logprobs,
            return_prompt_token_ids=self.return_prompt_token_ids,
            log_metrics=self.log_metrics,
            require_reasoning=self.require_reasoning,
        )


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: str
    input_ids: List[int]
    sampling_params: Any  # SamplingParams
    return_logprob: bool
    stream: bool
    log_metrics: bool = True
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[List[int]] = None
    require_reasoning: bool = False
    # Output formatting only (the tokenizer manager's; the scheduler ignores them).
    return_text_in_logprobs: bool = False
    return_prompt_token_ids: bool = False


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
    # The hybrid SWA pool's window slots held by requests (not free, not evictable), and their share of that pool.
    num_used_swa_tokens: int = 0
    swa_token_usage: float = 0.0
    cached_tokens_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    gen_throughput: float = 0.0
    num_retractions: int = 0  # retractions so far (a request may be retracted more than once)
    num_retracted_waiting: int = 0  # waiting requests that were retracted at least once
    num_oom_recoveries: int = 0  # batches aborted after an out-of-memory error, the server kept serving
    forward_ct: int = 0  # forwards run so far: the heartbeat /health watches
    # Decode steps launched right after another decode step, and the wall time between those launches: the
    # serving loop's period while it only decodes (the graph step when the host keeps up, more when not).
    decode_periods: int = 0
    decode_period_seconds: float = 0.0
    # The device's time by batch kind, and its idle gaps between batches while the scheduler had work, by the
    # kind of the batch that followed (device_timeline.py): host work the overlap scheduler did not hide.
    prefill_batches: int = 0
    prefill_device_seconds: float = 0.0
    decode_batches: int = 0
    decode_device_seconds: float = 0.0
    device_gap_before_prefill_seconds: float = 0.0
    device_gap_before_decode_seconds: float = 0.0
    kt_slot: Optional[dict] = None  # the elastic KT prefill slot (ElasticSlotStats), when there is one


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
    stop_regexes: List[List[str]]  # trimmed from like stop strings; text that may still match is held back
    # time.monotonic() of each request's first token in the scheduler (CLOCK_MONOTONIC is one clock for
    # every process of the host), so TTFT is right even when tokens are sent only at the end.
    first_token_times: List[Optional[float]]
    queue_times: List[Optional[float]]  # seconds from arrival at the scheduler to the first prefill
    # Per request, when it asked for logprobs: new top-k / chosen-id pairs of its output tokens
    # ("output_top", "output_ids") and, once, its prompt logprobs ("input_token", "input_top", "input_ids").
    logprob_extras: List[Optional[dict]]


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
    queue_times: List[Optional[float]]
    logprob_extras: List[Optional[dict]]


@dataclass
class SchedulerFailed:
    """Sent when a scheduler dies: the launcher or tokenizer manager turns it into errors and an exit."""

    message: str
