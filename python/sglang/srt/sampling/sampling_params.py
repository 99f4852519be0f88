"""Per-request sampling parameters (SGLang's names), validated with messages that name the field.

Every key of upstream SGLang's SamplingParams is accepted. Those this engine honours are checked
for type and range here, where they are parsed, so no value can reach a tensor (int64 seeds, top-k
counts) or the detokenizer (booleans) and fail there. Custom logit processors (custom_params) are
accepted at their default (None) and refused with a 400 naming the key when set.
The constraints (json_schema, regex, ebnf, structural_tag) are checked here for shape; they compile in
the scheduler (constrained/xgrammar_backend.py).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Dict, List, Optional, Union

from sglang.srt.constrained.grammar_key import GRAMMAR_KINDS, GrammarKey, grammar_key_of, schema_text
from sglang.srt.sampling.stop_regex import parse_stop_regex

_MAX_NEW_TOKENS_DEFAULT = 128
INT32_MAX = (1 << 31) - 1
MAX_STOP_STRINGS = 128
MAX_STOP_STRING_CHARS = 1024
MAX_PARALLEL_SAMPLES = 64  # n: parallel samples of one prompt
# Upstream keys whose features this engine does not have: fine when None, a 400 naming them otherwise.
UNSUPPORTED_KEYS = {
    "custom_params": "custom logit processors (custom_params)",
}


class SamplingParamsError(ValueError):
    """Bad sampling parameter; the HTTP layer turns it into a 400."""


def to_int64(value: int) -> int:
    """A seed in [-2^63, 2^64) as the signed 64-bit integer a torch.int64 tensor can hold."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# Set by verify() from the others, never by a request.
DERIVED_FIELDS = ("stop_strs", "stop_str_max_len", "stop_regexes", "stop_regex_max_len", "logit_bias_ids")


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
    stop_regex: Optional[Union[str, List[str]]] = None  # stop once the output matches one (sampling/stop_regex.py)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: Optional[int] = None
    n: int = 1
    stream_interval: Optional[int] = None  # tokens per streamed chunk; None: --stream-interval
    logit_bias: Optional[Dict[str, float]] = None  # {"token id": bias added to its logit}
    # Constrained decoding: at most one (grammar_key); json_schema / structural_tag as JSON text.
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    # Derived in verify(): stop strings and regexes as lists, their longest match for the tail check, the
    # bias as ints.
    stop_strs: List[str] = field(default_factory=list)
    stop_str_max_len: int = 0
    stop_regexes: List[str] = field(default_factory=list)
    stop_regex_max_len: int = 0
    logit_bias_ids: Dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "SamplingParams":
        if d is not None and not isinstance(d, dict):
            raise SamplingParamsError(f"sampling_params must be an object, got {type(d).__name__}")
        d = dict(d or {})
        if "seed" in d and "sampling_seed" not in d:
            d["sampling_seed"] = d.pop("seed")
        for key, feature in UNSUPPORTED_KEYS.items():
            if d.pop(key, None) is not None:
                raise SamplingParamsError(f"{key}: {feature} is not supported by this server (send null or omit it)")
        known = {f for f in cls.__dataclass_fields__ if f not in DERIVED_FIELDS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SamplingParamsError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        params = cls(**{k: v for k, v in d.items() if v is not None})
        params.verify()
        return params

    def changed_fields(self) -> Dict[str, Any]:
        """The parameters set away from their defaults (what --log-requests shows): a grammar by its length only."""
        changed = {}
        for f in fields(self):
            if f.name in DERIVED_FIELDS:
                continue
            value = getattr(self, f.name)
            if value != (f.default_factory() if f.default is MISSING else f.default):
                changed[f.name] = f"<{len(value)} chars>" if f.name in GRAMMAR_KINDS else value
        return changed

    def verify(self, vocab_size: Optional[int] = None) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise SamplingParamsError(msg)

        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            need(_is_num(getattr(self, name)), f"{name} must be a finite number, got {getattr(self, name)!r}")
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            need(_is_int(getattr(self, name)), f"{name} must be an integer, got {getattr(self, name)!r}")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
            need(isinstance(getattr(self, name), bool), f"{name} must be true or false, got {getattr(self, name)!r}")
        need(
            0 <= self.max_new_tokens <= INT32_MAX,
            f"max_new_tokens must be in [0, {INT32_MAX}], got {self.max_new_tokens}",
        )
        need(
            0 <= self.min_new_tokens <= self.max_new_tokens or self.max_new_tokens == 0,
            f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}",
        )
        need(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(
            self.top_k == -1 or 1 <= self.top_k <= INT32_MAX,
            f"top_k must be -1 (off) or in [1, {INT32_MAX}], got {self.top_k}",
        )
        need(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        need(-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        need(-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        need(0 < self.repetition_penalty <= 2, f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        need(1 <= self.n <= MAX_PARALLEL_SAMPLES, f"n must be in [1, {MAX_PARALLEL_SAMPLES}], got {self.n}")
        if self.sampling_seed is not None:
            need(
                _is_int(self.sampling_seed) and -(1 << 63) <= self.sampling_seed < 1 << 64,
                f"seed must be an integer in [-2^63, 2^64), got {self.sampling_seed!r}",
            )
        if self.stream_interval is not None:
            need(
                _is_int(self.stream_interval) and 1 <= self.stream_interval <= INT32_MAX,
                f"stream_interval must be an integer >= 1, got {self.stream_interval!r}",
            )
        if self.stop_token_ids is not None:
            need(
                isinstance(self.stop_token_ids, list) and all(_is_int(t) for t in self.stop_token_ids),
                "stop_token_ids must be a list of integers",
            )
            if vocab_size is not None:
                need(
                    all(0 <= t < vocab_size for t in self.stop_token_ids),
                    f"stop_token_ids must be in [0, {vocab_size})",
                )
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        stops = [] if stops is None else stops
        need(
            isinstance(stops, list) and all(isinstance(s, str) and s for s in stops),
            "stop must be a non-empty string or a list of non-empty strings",
        )
        need(
            len(stops) <= MAX_STOP_STRINGS and all(len(s) <= MAX_STOP_STRING_CHARS for s in stops),
            f"stop: at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_STRING_CHARS} characters",
        )
        self.stop_strs = stops
        self.stop_str_max_len = max((len(s) for s in stops), default=0)
        if self.stop_regex is not None:
            try:
                self.stop_regexes, self.stop_regex_max_len = parse_stop_regex(self.stop_regex)
            except ValueError as e:
                raise SamplingParamsError(str(e)) from None
        self.logit_bias_ids = self._verify_logit_bias(vocab_size)
        self._verify_constraints()

    def _verify_constraints(self) -> None:
        try:
            if self.json_schema is not None:
                self.json_schema = schema_text(self.json_schema, "json_schema")
            if self.structural_tag is not None:
                self.structural_tag = schema_text(self.structural_tag, "structural_tag")
            for name in ("regex", "ebnf"):
                value = getattr(self, name)
                if value is not None and (not isinstance(value, str) or not value):
                    raise ValueError(f"{name} must be a non-empty string")
            grammar_key_of(self.json_schema, self.regex, self.ebnf, self.structural_tag)
        except ValueError as e:
            raise SamplingParamsError(str(e)) from None

    @property
    def grammar_key(self) -> Optional[GrammarKey]:
        """The constraint this request's tokens must follow (verify() made sure there is at most one)."""
        return grammar_key_of(self.json_schema, self.regex, self.ebnf, self.structural_tag)

    def _verify_logit_bias(self, vocab_size: Optional[int]) -> Dict[int, float]:
        if self.logit_bias is None:
            return {}
        if not isinstance(self.logit_bias, dict):
            raise SamplingParamsError('logit_bias must be an object of {"token id": bias}')
        out: Dict[int, float] = {}
        for key, bias in self.logit_bias.items():
            # ASCII digits only: str.isdigit() is true for "²" (which int() refuses) and "١" (Arabic-Indic one,
            # which int() reads as 1): neither is a token id as OpenAI's API writes them.
            is_id = isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12
            tid = int(key) if is_id else key
            if not _is_int(tid) or (vocab_size is not None and not 0 <= tid < vocab_size):
                where = "" if vocab_size is None else f" in [0, {vocab_size})"
                raise SamplingParamsError(f"logit_bias: {key!r} is not a token id{where}")
            if not _is_num(bias) or not -100 <= bias <= 100:
                raise SamplingParamsError(f"logit_bias[{key!r}] must be a number in [-100, 100], got {bias!r}")
            out[tid] = float(bias)
        return out

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1
