"""A launched batch and its result on the way to the host: what the overlap loop hands from launch to processing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

from sglang.srt.managers.device_timeline import DeviceMark
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.layers.sampler import SampleOutput
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.logprobs import InputLogprobs, LogprobExtras, LogprobRequests

Pairs = List[Tuple[float, int]]


def _pairs(values: Optional[List[List[float]]], ids: Optional[List[List[int]]], row: int, n: int) -> Pairs:
    return list(zip(values[row][:n], ids[row][:n])) if values is not None and n else []


def _host_copy(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A copy on the host, enqueued on the current stream (pinned, non-blocking on CUDA)."""
    if x is None:
        return None
    return x.to("cpu", non_blocking=True) if x.device.type != "cpu" else x


@dataclass(frozen=True)
class UnsampledForward:
    """A forward launched on the device whose sampling is not launched yet: a batch with grammar rows waits
    for the step in flight to be processed (its matchers must accept that step's tokens before they say what
    may come next), while the device already runs this forward."""

    logits: "LogitsProcessorOutput"
    forward_batch: "ForwardBatch"
    start: DeviceMark  # before the forward


@dataclass(frozen=True)
class PendingResult:
    """One forward's outputs on their way to the host: copies enqueued behind the forward on its stream and
    an event after them, so the scheduler can launch the next step before reading these."""

    sampled: "SampleOutput"  # host tensors, valid once `end` has completed
    prompt: Optional["InputLogprobs"]
    requests: Optional["LogprobRequests"]
    start: DeviceMark  # before the forward
    end: DeviceMark  # after the copies (on the CPU the copies are the tensors themselves)

    @classmethod
    def launch(
        cls,
        sampled: "SampleOutput",
        prompt: Optional["InputLogprobs"],
        requests: Optional["LogprobRequests"],
        start: DeviceMark,
    ) -> "PendingResult":
        def extras_copy(e: Optional["LogprobExtras"]) -> Optional["LogprobExtras"]:
            return None if e is None else type(e)(*(_host_copy(t) for t in (e.top_values, e.top_ids, e.chosen)))

        host_sampled = type(sampled)(
            _host_copy(sampled.next_token_ids), _host_copy(sampled.logprobs), extras_copy(sampled.extras)
        )
        host_prompt = None
        if prompt is not None:
            host_prompt = type(prompt)(_host_copy(prompt.token_logprobs), extras_copy(prompt.extras))
        end = DeviceMark.now(on_cuda=start.event is not None)  # the same clock as `start`
        return cls(host_sampled, host_prompt, requests, start, end)

    def resolve(self) -> "BatchResult":
        """Wait for the copies (the forward's end), then read them."""
        self.end.synchronize()
        return BatchResult.from_host(self.sampled, self.prompt, self.requests)


@dataclass
class BatchResult:
    """One forward's results on the host: sampled tokens and every logprob some request asked for."""

    next_ids: List[int]
    logprobs: List[float]
    top_values: Optional[List[List[float]]] = None  # per batch row, the batch's largest top-k
    top_ids: Optional[List[List[int]]] = None
    chosen: Optional[List[List[float]]] = None  # per batch row, aligned with its token_ids_logprob
    input_token: Optional[List[float]] = None  # per scored prompt row (LogprobRequests.input_rows)
    input_top_values: Optional[List[List[float]]] = None
    input_top_ids: Optional[List[List[int]]] = None
    input_chosen: Optional[List[List[float]]] = None
    requests: Optional["LogprobRequests"] = None

    @classmethod
    def from_host(
        cls, sampled: "SampleOutput", prompt: Optional["InputLogprobs"], requests: Optional["LogprobRequests"]
    ) -> "BatchResult":
        def host(x):
            return None if x is None else x.tolist()

        ids = sampled.next_token_ids.tolist()
        out = cls(ids, host(sampled.logprobs) or [0.0] * len(ids), requests=requests)
        extras: Optional["LogprobExtras"] = sampled.extras
        if extras is not None:
            out.top_values, out.top_ids, out.chosen = host(extras.top_values), host(extras.top_ids), host(extras.chosen)
        if prompt is not None:
            out.input_token = host(prompt.token_logprobs)
            e = prompt.extras
            out.input_top_values, out.input_top_ids, out.input_chosen = (
                host(e.top_values),
                host(e.top_ids),
                host(e.chosen),
            )
        return out

    def output_extras(self, row: int, req: "Req") -> Tuple[Pairs, Pairs]:
        """(top-k pairs, chosen-id pairs) at batch row `row`'s sampled position."""
        chosen = list(zip(self.chosen[row], req.token_ids_logprob)) if self.chosen and req.token_ids_logprob else []
        return _pairs(self.top_values, self.top_ids, row, req.top_logprobs_num), chosen

    def add_prompt_logprobs(self, row: int, req: "Req", prefix_len: int) -> None:
        """Append what this prefill chunk scored of batch row `row`'s prompt to the request."""
        got = req.input_logprobs
        if req.logprob_start_len == 0 and prefix_len == 0:  # nothing predicts the first prompt token
            got.token.append((None, req.origin_input_ids[0]))
            got.top.append(None)
            got.chosen.append(None)
        if self.requests is None or self.input_token is None:
            return
        for k, owner in enumerate(self.requests.input_owner):
            if owner != row:
                continue
            got.token.append((self.input_token[k], self.requests.input_targets[k]))
            got.top.append(_pairs(self.input_top_values, self.input_top_ids, k, req.top_logprobs_num))
            ids = req.token_ids_logprob
            got.chosen.append(list(zip(self.input_chosen[k], ids)) if self.input_chosen and ids else [])


@dataclass(frozen=True)
class LaunchedBatch:
    """A batch as it was launched, with its result on the way. Its result is matched against this, never
    against the live ScheduleBatch: the running batch is one object, prepared again for the next step
    (and filtered as requests finish) while this one's tokens are still in flight."""

    forward_mode: ForwardMode
    reqs: Tuple["Req", ...]
    seq_lens: Tuple[int, ...]
    prefix_lens: Tuple[int, ...]
    extend_lens: Tuple[int, ...]
    chunked_req: Optional["Req"]  # the request whose prefill continues in a later chunk (it gets no token)
    num_decode: int = 0  # a mixed prefill: its last num_decode requests are running decodes
    result: Optional[PendingResult] = None  # None until the forward and its sampling are launched
    unsampled: Optional[UnsampledForward] = None  # the forward, while its sampling waits (grammar rows)

    @classmethod
    def of(cls, batch: "ScheduleBatch", chunked_req: Optional["Req"]) -> "LaunchedBatch":
        extend = batch.forward_mode.is_extend()
        return cls(
            batch.forward_mode,
            tuple(batch.reqs),
            tuple(batch.seq_lens),
            tuple(batch.prefix_lens) if extend else (),
            tuple(batch.extend_lens) if extend else (),
            chunked_req if extend else None,
            batch.num_decode if extend else 0,
        )

    def batch_size(self) -> int:
        return len(self.reqs)
