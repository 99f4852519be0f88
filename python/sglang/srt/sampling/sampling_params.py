"""Per-request sampling parameters (SGLang's names), validated with messages that name the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

_MAX_NEW_TOKENS_DEFAULT = 128


class SamplingParamsError(ValueError):
    """Bad sampling parameter; the HTTP layer turns it into a 400."""


@dataclass
class SamplingParams:
    max_new_tokens: int = _MAX_NEW_TOKENS_DEFAULT
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: Optional[int] = None
    n: int = 1
    # Derived in normalize(): stop strings as a list, max stop length for the tail check.
    stop_strs: List[str] = field(default_factory=list)
    stop_str_max_len: int = 0

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "SamplingParams":
        d = dict(d or {})
        if "seed" in d and "sampling_seed" not in d:
            d["sampling_seed"] = d.pop("seed")
        known = {f for f in cls.__dataclass_fields__ if f not in ("stop_strs", "stop_str_max_len")}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SamplingParamsError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        try:
            params = cls(**{k: v for k, v in d.items() if v is not None})
        except TypeError as e:
            raise SamplingParamsError(str(e)) from None
        params.verify()
        return params

    def verify(self, vocab_size: Optional[int] = None) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise SamplingParamsError(msg)

        def is_num(x) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            need(is_num(getattr(self, name)), f"{name} must be a number, got {getattr(self, name)!r}")
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            need(isinstance(getattr(self, name), int) and not isinstance(getattr(self, name), bool),
                 f"{name} must be an integer, got {getattr(self, name)!r}")
        need(self.max_new_tokens >= 0, f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        need(0 <= self.min_new_tokens <= self.max_new_tokens or self.max_new_tokens == 0,
             f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}")
        need(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        need(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        need(-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        need(-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        need(0 < self.repetition_penalty <= 2, f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        need(self.n == 1, f"n must be 1 (parallel sampling is not supported), got {self.n}")
        if self.sampling_seed is not None:
            need(isinstance(self.sampling_seed, int) and not isinstance(self.sampling_seed, bool),
                 f"seed must be an integer, got {self.sampling_seed!r}")
        if self.stop_token_ids is not None:
            need(isinstance(self.stop_token_ids, list) and all(isinstance(t, int) for t in self.stop_token_ids),
                 "stop_token_ids must be a list of integers")
            if vocab_size is not None:
                need(all(0 <= t < vocab_size for t in self.stop_token_ids), f"stop_token_ids must be in [0, {vocab_size})")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        need(isinstance(stops, list) and all(isinstance(s, str) and s for s in stops),
             "stop must be a non-empty string or a list of non-empty strings")
        self.stop_strs = stops
        self.stop_str_max_len = max((len(s) for s in stops), default=0)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1
