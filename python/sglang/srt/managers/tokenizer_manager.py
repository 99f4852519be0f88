"""TokenizerManager: validates and tokenizes requests, sends them to the scheduler, gathers outputs.

Runs in the main process on an asyncio loop (the HTTP server's, or the offline Engine's). Each
request has a ReqState that the receive loop fills from the detokenizer's BatchStrOut messages.

The loop must stay responsive whatever one request sends: tokenization and chat templates run on
worker threads (`run_cpu`), after a size check that needs no tokenizer, and a text far over its token
limit is refused after tokenizing a bounded prefix of it (`refuse_over_limit`), so a multi-megabyte
prompt neither freezes other streams or /health nor holds a tokenizer thread for seconds. It also
watches the engine: a child process that dies is seen at once (its process sentinel is a file
descriptor on the loop), every request in flight is answered 503 with which child died and how, and
the scheduler's periodic stats are its heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Set, Sized, Tuple, TypeVar

import zmq
import zmq.asyncio

from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchStrOut,
    FlushCacheReq,
    FlushCacheReqOutput,
    GenerateReqInput,
    SchedulerFailed,
    SchedulerStats,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.tokenizer_metrics import TokenizerMetrics
from sglang.srt.sampling.sampling_params import SamplingParams, SamplingParamsError, to_int64
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.process import PortArgs, describe_exit

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Normalizers may shrink text (NFKC folds some 3-byte characters into one byte): the byte bound on the
# token count below is loosened by this factor so that it never refuses a prompt that would fit.
NORMALIZATION_SLACK = 4
CLIENT_GONE_STATUS = 499  # aborts nobody waits for (the client went away)
REAP_WAIT_S = 1.0

# A text is refused as soon as a prefix of it has too many tokens (refuse_over_limit). The first prefix is
# (limit + slack) * PREFIX_CHARS_PER_TOKEN characters: generous (text averages 3-5 characters a token), so a text
# that fits is tokenized once, whole, and a doomed one costs about one context's worth of tokenizer time.
PREFIX_CHARS_PER_TOKEN = 8
PREFIX_GROWTH = 4  # denser text (long runs of '=', spaces): prefixes 4x longer each time, 1/3 extra work at most
# How many more tokens a prefix may have than the whole text has in that stretch (see refuse_over_limit): the most
# measured with SmolLM2's byte-level BPE was 3, at random cuts in code, CJK, base64, '=' runs and random Unicode.
BOUNDARY_SLACK_TOKENS = 256
# /tokenize (and any encode through TokenizerManager.tokenizer) takes texts of up to this many context lengths:
# counting a document longer than the context is a use, but one text must not hold a tokenizer thread for long.
TOKENIZE_CONTEXTS = 32
# Tokenizer threads: a short request is tokenized while a long one is (HF fast tokenizers encode in Rust without
# the GIL). Measured on 2 cores: a short encode waited 4.4 s behind a 5.2 MB one with 1 thread, 2 ms with 2; a
# short /tokenize beside a 1 MB one (under its limit) took 1.76 s with 1 thread, 6 ms with 2.
CPU_WORKERS = 2


class RequestError(Exception):
    """A request the server refuses or could not finish; the HTTP layer answers `status_code` with the message."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


@dataclass
class ReqState:
    text: str = ""
    output_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    finished_reason: Optional[dict] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    created: float = field(default_factory=time.monotonic)
    first_token_time: Optional[float] = None
    last_chunk_time: Optional[float] = None  # arrival of the latest new tokens (inter-token latency)
    error: Optional[RequestError] = None
    req: Optional[TokenizedGenerateReqInput] = None  # what was asked (logprob options, output format)
    # Logprobs beyond the sampled tokens' (see scheduler_components/output_processor._logprob_extras): lists of (logprob, id).
    output_top: List[list] = field(default_factory=list)
    output_chosen: List[list] = field(default_factory=list)
    prompt: Dict[str, list] = field(default_factory=dict)
    shown_rid: Optional[str] = None  # the id its output names, when not its scheduler id (a sample of n > 1)

    @property
    def log_metrics(self) -> bool:
        return self.req is None or self.req.log_metrics


def max_token_bytes(tokenizer) -> int:
    """An upper bound on the UTF-8 bytes of input one token can stand for (the longest vocabulary entry;
    byte-level and SentencePiece spellings are never shorter than the bytes they cover)."""
    return max((len(tok.encode("utf-8", "replace")) for tok in tokenizer.get_vocab()), default=1) or 1


def parallel_samples(t: TokenizedGenerateReqInput) -> List[Tuple[str, TokenizedGenerateReqInput]]:
    """The n samples of one prompt as n requests, each with the id its output shows (`rid-0` ... `rid-{n-1}`).
    Their scheduler ids are random, as upstream's (`regenerate_rid`): a client cannot name, and so collide with,
    a sample of another request. A seeded prompt gives each sample its own seed (seed + j), so the samples
    differ and are still reproducible."""
    n = t.sampling_params.n
    if n == 1:
        return [(t.rid, t)]
    seed = t.sampling_params.sampling_seed
    return [
        (
            f"{t.rid}-{j}",
            dataclasses.replace(
                t,
                rid=uuid.uuid4().hex,
                sampling_params=dataclasses.replace(
                    t.sampling_params, n=1, sampling_seed=None if seed is None else to_int64(seed + j)
                ),
            ),
        )
        for j in range(n)
    ]


def prefill_only(t: TokenizedGenerateReqInput) -> TokenizedGenerateReqInput:
    """The prompt's prefill alone (max_new_tokens 0, a random id as the samples'): it leaves the prompt in the
    radix cache."""
    params = dataclasses.replace(t.sampling_params, n=1, max_new_tokens=0, min_new_tokens=0)
    return dataclasses.replace(
        t, rid=uuid.uuid4().hex, sampling_params=params, return_logprob=False, stream=False, log_metrics=False
    )


def refuse_over_limit(text: str, limit: int, encode: Callable[[str], Sized], too_long: Callable[[int], str]) -> None:
    """Raise RequestError(too_long(n)) when `text` is known to have n > `limit` tokens from a prefix of it alone.

    Why a prefix's count bounds the whole's from below: the tokenizers we serve (byte-level BPE with a regex
    pre-tokenizer: GPT-2, Llama 3, Qwen, SmolLM2; SentencePiece BPE/Unigram over '▁'-words) split the text
    into words and encode each on its own, or never merge across a word start. So the whole's tokens are the
    prefix's for every word that ends before the cut, plus more: count(whole) >= count(prefix) - (what the cut
    changed in the prefix's last word). Cutting just before a space makes that last word whole; where there is
    no space to cut at (CJK, long runs), the cut word has at most a few tokens more in the prefix than its part
    of the whole has (3 measured), far under BOUNDARY_SLACK_TOKENS. So a text that fits is never refused.

    Cost: prefixes from (limit + slack) * PREFIX_CHARS_PER_TOKEN characters, PREFIX_GROWTH times longer each
    round while they fit, so a doomed text costs a few limits' worth of tokens whatever its size."""
    window = (limit + BOUNDARY_SLACK_TOKENS) * PREFIX_CHARS_PER_TOKEN
    while len(text) > window:
        space = text.rfind(" ", window - window // 4, window)  # a word boundary near the window's end
        cut = space if space > 0 and not text[space - 1].isspace() else window
        at_least = len(encode(text[:cut])) - BOUNDARY_SLACK_TOKENS
        if at_least > limit:
            raise RequestError(too_long(at_least))
        window *= PREFIX_GROWTH


class BoundedTokenizer:
    """`TokenizerManager.tokenizer`: the HF tokenizer (every attribute is its), except that texts far over a
    token limit are refused after tokenizing a prefix (refuse_over_limit) instead of whole:

    - `encode_prompt`: a prompt (/generate's and /v1/completions' text, the chat endpoints' rendered messages,
      every message together) must fit the context;
    - `encode` of any other text: at most TOKENIZE_CONTEXTS context lengths (/tokenize counts documents
      longer than the context)."""

    def __init__(self, tokenizer: Any, context_len: int) -> None:
        self.unbounded = tokenizer
        self.context_len = context_len
        self.text_limit = TOKENIZE_CONTEXTS * context_len

    def __getattr__(self, name: str) -> Any:  # only for names this class lacks
        if name == "unbounded":  # not set yet (a copy being built): no endless recursion
            raise AttributeError(name)
        return getattr(self.unbounded, name)

    def __len__(self) -> int:
        return len(self.unbounded)

    def encode_prompt(self, text: str, **kwargs: Any) -> List[int]:
        refuse_over_limit(
            text,
            self.context_len - 1,  # as tokenize_one: a prompt of context_len tokens leaves no room for an output
            lambda s: self.unbounded.encode(s, **kwargs),
            lambda n: f"the prompt has at least {n} tokens; this model's context length is {self.context_len}",
        )
        return self.unbounded.encode(text, **kwargs)

    def encode(self, text: Any, *args: Any, **kwargs: Any) -> List[int]:
        if isinstance(text, str):
            refuse_over_limit(
                text,
                self.text_limit,
                lambda s: self.unbounded.encode(s, *args, **kwargs),
                lambda n: (
                    f"the text has at least {n} tokens; this server tokenizes at most {self.text_limit} "
                    f"({TOKENIZE_CONTEXTS} x the context length) in one text"
                ),
            )
        return self.unbounded.encode(text, *args, **kwargs)


class TokenizerManager:
    def __init__(
        self, server_args: ServerArgs, port_args: PortArgs, scheduler_info: dict, tokenizer: Optional[Any] = None
    ) -> None:
        """`tokenizer`: the one the launcher loaded already (None: load it here unless --skip-tokenizer-init)."""
        self.server_args = server_args
        self.scheduler_info = scheduler_info
        self.context_len: int = scheduler_info["context_len"]
        self.vocab_size: int = scheduler_info["vocab_size"]
        self.tokenizer = None
        self.max_prompt_bytes: Optional[int] = None
        if not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_tokenizer import get_tokenizer

            hf = (
                tokenizer
                if tokenizer is not None
                else get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
            )
            self.max_prompt_bytes = self.context_len * max_token_bytes(hf) * NORMALIZATION_SLACK
            self.tokenizer = BoundedTokenizer(hf, self.context_len)
        self.port_args = port_args
        self.rid_to_state: Dict[str, ReqState] = {}
        self.stats = SchedulerStats(max_total_num_tokens=scheduler_info["max_total_num_tokens"])
        self.metrics = TokenizerMetrics(server_args.served_model_name)
        self.fatal_error: Optional[str] = None
        self.on_fatal: Callable[[str], None] = lambda msg: None
        self.last_heartbeat = time.monotonic()
        self.request_timeout_s = envs.SGLANG_REQUEST_TIMEOUT_S.get()
        self._flush_waiters: List[asyncio.Future] = []
        self._loop_task: Optional[asyncio.Task] = None
        self._zmq_ctx: Optional[zmq.asyncio.Context] = None
        self._stopped = False
        self._draining = False
        self._tasks: List[asyncio.Task] = []
        self._watched_fds: List[int] = []
        self._children: Dict[str, List[str]] = {}  # a prompt's rid -> the rids of its n > 1 samples and warm-up
        # Ids admitted requests will use but may not have registered yet (_reserve): an n > 1 prompt's own id is
        # never registered, its samples' only after the warm-up prefill.
        self._reserved: Set[str] = set()
        # Ids of requests aborted here whose end the scheduler has not sent yet: its final output is still to come
        # (every abort path ends in one), and a new request under the same id would receive it.
        self._aborting: Set[str] = set()
        self._token_texts: Dict[int, str] = {}  # token id -> its text alone (logprob entries), at most the vocab
        # HF fast tokenizers may encode from several threads at once: a call changes the Rust tokenizer only when
        # it asks for other truncation / padding / special-token splitting than the last one (then a concurrent
        # call fails with "Already borrowed"), and nothing here passes those options. (The loop thread already
        # decodes while a worker encodes.)
        self._cpu_pool = ThreadPoolExecutor(max_workers=CPU_WORKERS, thread_name_prefix="sglang-tokenize")
        self.child_processes: List = []

    # ------------------------------------------------------------- sockets
    def start(self) -> None:
        """Create the sockets, the receive loop and the child watch on the running loop (idempotent)."""
        if self._loop_task is not None:
            return
        ctx = self._zmq_ctx = zmq.asyncio.Context(2)
        self.recv_socket = ctx.socket(zmq.PULL)
        self.recv_socket.bind(self.port_args.tokenizer_ipc_name)
        self.send_to_scheduler = ctx.socket(zmq.PUSH)
        self.send_to_scheduler.connect(self.port_args.scheduler_input_ipc_name)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.handle_loop())]
        self._loop_task = self._tasks[0]
        self.last_heartbeat = time.monotonic()
        for p in self.child_processes:
            # A process sentinel becomes readable the moment the child exits, however it died.
            loop.add_reader(p.sentinel, self._on_child_exit, p)
            self._watched_fds.append(p.sentinel)
        self.check_children()  # one that died before the loop started

    async def stop(self) -> None:
        """Cancel the background tasks (before the loop closes) and close the sockets."""
        loop = asyncio.get_running_loop()
        for fd in self._watched_fds:
            loop.remove_reader(fd)
        self._watched_fds = []
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        self._stopped = True
        self._cpu_pool.shutdown(wait=False, cancel_futures=True)
        if self._zmq_ctx is not None:
            # linger=0: a message still queued for a scheduler that is gone (an abort) must not block
            # close/term forever -- nor pyzmq's destroy() when the context is garbage-collected later.
            self._zmq_ctx.destroy(linger=0)
            self._zmq_ctx = None

    async def handle_loop(self) -> None:
        while True:
            msg = await self.recv_socket.recv_pyobj()
            if isinstance(msg, BatchStrOut):
                self._on_outputs(msg)
            elif isinstance(msg, SchedulerStats):
                self.stats = msg
                self.last_heartbeat = time.monotonic()
                self.metrics.observe_scheduler(msg)
            elif isinstance(msg, FlushCacheReqOutput):
                waiters, self._flush_waiters = self._flush_waiters, []
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(msg)
            elif isinstance(msg, SchedulerFailed):
                last_line = msg.message.strip().splitlines()[-1] if msg.message.strip() else "no message"
                self._fatal(f"the scheduler hit an exception: {last_line}")

    # ---------------------------------------------------------- liveness
    def _on_child_exit(self, process) -> None:
        asyncio.get_running_loop().remove_reader(process.sentinel)
        # The sentinel closes while the child is exiting, a moment before it can be reaped.
        process.join(REAP_WAIT_S)
        self._fatal(describe_exit(process.name, process.pid, process.exitcode))

    def check_children(self) -> None:
        """Notice a dead child now (cheap: a non-blocking waitpid per child)."""
        if self.fatal_error is None:
            for p in self.child_processes:
                if not p.is_alive():
                    self._fatal(describe_exit(p.name, p.pid, p.exitcode))
                    return

    def stalled_for(self) -> float:
        """Seconds since the scheduler's last heartbeat (it sends one every 0.5 s while its loop runs)."""
        return time.monotonic() - self.last_heartbeat

    def _fatal(self, message: str) -> None:
        if self.fatal_error is not None:
            return
        self.fatal_error = message
        logger.error("Fatal: the engine died: %s", message)
        self.fail_all(f"the engine died: {message}; the server is shutting down", 503)
        self.on_fatal(message)

    def fail_all(self, message: str, status_code: int) -> None:
        """Answer every request in flight with this error (engine death, end of a graceful shutdown)."""
        for state in self.rid_to_state.values():
            if state.error is None and state.finished_reason is None:
                state.error = RequestError(message, status_code)
                state.event.set()

    def begin_shutdown(self) -> None:
        """New requests get 503 from now on; those in flight keep running."""
        self._draining = True

    def num_in_flight(self) -> int:
        return len(self.rid_to_state)

    def _check_alive(self) -> None:
        self.check_children()
        if self.fatal_error is not None:
            raise RequestError(f"the engine died: {self.fatal_error}; the server is shutting down", 503)
        if self._stopped or self._draining:
            raise RequestError("the server is shutting down", 503)

    # ------------------------------------------------------------ outputs
    def _on_outputs(self, out: BatchStrOut) -> None:
        now = time.monotonic()
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:  # aborted and forgotten; its final output frees the id
                if out.finished_reasons[i] is not None:
                    self._aborting.discard(rid)
                continue
            state.text += out.output_strs[i]
            extras = out.logprob_extras[i]
            if extras:
                state.output_top.extend(extras.get("output_top", []))
                state.output_chosen.extend(extras.get("output_ids", []))
                state.prompt.update({k: v for k, v in extras.items() if k.startswith("input_")})
            new_tokens = len(out.output_ids[i])
            state.output_ids.extend(out.output_ids[i])
            state.logprobs.extend(out.output_token_logprobs[i])
            if state.first_token_time is None and state.output_ids:
                # The scheduler's timestamp: non-streamed tokens arrive only with the last one.
                first = out.first_token_times[i]
                state.first_token_time = first if first is not None else now
                if state.log_metrics:
                    self.metrics.observe_ttft(max(state.first_token_time - state.created, 0.0))
            elif new_tokens and state.last_chunk_time is not None and state.log_metrics:
                self.metrics.observe_inter_token(now - state.last_chunk_time, new_tokens)
            if new_tokens:
                state.last_chunk_time = now
            state.finished_reason = out.finished_reasons[i]
            state.meta = {
                "prompt_tokens": out.prompt_tokens[i],
                "completion_tokens": out.completion_tokens[i],
                "cached_tokens": out.cached_tokens[i],
            }
            fr = state.finished_reason
            if fr is not None and state.log_metrics and self.server_args.log_requests:
                logger.info(
                    "Finish: rid=%s finish_reason=%s prompt_tokens=%d completion_tokens=%d cached_tokens=%d "
                    "e2e_latency=%.3fs",
                    state.shown_rid or rid,
                    fr,
                    out.prompt_tokens[i],
                    out.completion_tokens[i],
                    out.cached_tokens[i],
                    now - state.created,
                )
            if fr is not None and state.log_metrics:
                self.metrics.observe_finished(
                    now - state.created,
                    out.prompt_tokens[i],
                    out.completion_tokens[i],
                    fr.get("type") == "abort",
                    out.queue_times[i],
                )
                if fr.get("source") == "detokenizer":  # the scheduler still runs it: stop it there
                    self.send_to_scheduler.send_pyobj(AbortReq(rid, fr.get("message", "aborted"), 500))
            state.event.set()

    # ----------------------------------------------------------- requests
    async def run_cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """Run CPU-heavy request work (tokenization, chat templates) off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._cpu_pool, fn, *args)

    def check_text_size(self, text: str, what: str = "the prompt") -> None:
        """Refuse a text that cannot fit the context before paying for its tokenization."""
        if self.max_prompt_bytes is not None and len(text) * 4 > self.max_prompt_bytes:  # 4: UTF-8's widest
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > self.max_prompt_bytes:
                raise RequestError(
                    f"{what} is {size} bytes; no text over {self.max_prompt_bytes} bytes fits this model's context "
                    f"length of {self.context_len} tokens"
                )

    def tokenize_one(self, obj: GenerateReqInput) -> TokenizedGenerateReqInput:
        """Validate one (non-batch) request and tokenize it. Thread-safe apart from the tokenizer."""
        if (obj.text is None) == (obj.input_ids is None):
            raise RequestError("give exactly one of `text` and `input_ids`")
        if obj.text is not None:
            if not isinstance(obj.text, str):
                raise RequestError("`text` must be a string or a list of strings")
            if self.tokenizer is None:
                raise RequestError("this server runs with --skip-tokenizer-init: send `input_ids`, not `text`")
            try:  # its size was checked on the loop already (generate_request), before this thread got it
                input_ids = self.tokenizer.encode_prompt(obj.text)  # a doomed one is refused after a prefix
            except RequestError:
                raise
            except Exception as e:  # noqa: BLE001 - text the tokenizer cannot take is the request's problem
                raise RequestError(f"text: the tokenizer cannot encode it: {type(e).__name__}: {e}") from None
        else:
            input_ids = obj.input_ids
            if not isinstance(input_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in input_ids
            ):
                raise RequestError("`input_ids` must be a list of integers")
            bad = [t for t in input_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise RequestError(f"input_ids out of the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        if not input_ids:
            raise RequestError("the prompt is empty")
        try:
            params = SamplingParams.from_dict(obj.sampling_params)
            params.verify(self.vocab_size)
        except SamplingParamsError as e:
            raise RequestError(str(e)) from None
        key = params.grammar_key
        if key is not None and self.server_args.grammar_backend == "none":
            raise RequestError(f"{key.kind}: constrained decoding is off on this server (--grammar-backend none)")
        if key is not None and self.tokenizer is None:
            raise RequestError(
                f"{key.kind}: constrained decoding needs a tokenizer; this server runs with --skip-tokenizer-init"
            )
        if params.stop_strs and self.tokenizer is None:
            raise RequestError("stop strings need a tokenizer; this server runs with --skip-tokenizer-init")
        if params.stop_regexes and self.tokenizer is None:
            raise RequestError("stop_regex needs a tokenizer; this server runs with --skip-tokenizer-init")
        if len(input_ids) >= self.context_len:
            raise RequestError(
                f"the prompt has {len(input_ids)} tokens; this model's context length is {self.context_len}"
            )
        if len(input_ids) + params.max_new_tokens > self.context_len:
            raise RequestError(
                f"prompt ({len(input_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the context "
                f"length {self.context_len}"
            )
        if not isinstance(obj.return_logprob, bool):
            raise RequestError("`return_logprob` must be a boolean")
        ids_lp = obj.token_ids_logprob
        if ids_lp is not None and not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in ids_lp):
            raise RequestError(f"token_ids_logprob must be token ids in [0, {self.vocab_size})")
        if obj.return_logprob and obj.logprob_start_len >= len(input_ids):
            raise RequestError(
                f"logprob_start_len ({obj.logprob_start_len}) must be smaller than the prompt's {len(input_ids)} tokens"
            )
        rid = obj.rid if obj.rid is not None else uuid.uuid4().hex
        if not isinstance(rid, str):
            raise RequestError("`rid` must be a string")
        return TokenizedGenerateReqInput(
            rid,
            obj.text or "",
            list(input_ids),
            params,
            obj.return_logprob,
            obj.stream,
            log_metrics=obj.log_metrics,
            logprob_start_len=obj.logprob_start_len,
            top_logprobs_num=obj.top_logprobs_num or 0,
            token_ids_logprob=list(ids_lp) if ids_lp else None,
            require_reasoning=obj.require_reasoning,
            return_text_in_logprobs=obj.return_text_in_logprobs,
            return_prompt_token_ids=obj.return_prompt_token_ids,
        )

    def _tokenize_all(self, items: List[GenerateReqInput]) -> List[TokenizedGenerateReqInput]:
        return [self.tokenize_one(it) for it in items]

    def _id_in_use(self, rid: str, reserved_here: bool = False) -> Optional[str]:
        """Why `rid` cannot be taken now (a request in flight holds it: registered, reserved, or aborted with its
        end still to come), or None. `reserved_here`: the caller holds the reservation (`_send` after `_reserve`)."""
        if rid in self.rid_to_state or (rid in self._reserved and not reserved_here):
            return f"request id {rid!r} is already in flight"
        if rid in self._aborting:
            return f"request id {rid!r} is still in flight: aborted, its end not yet confirmed"
        return None

    def _check_new_rids(self, rids: List[str]) -> None:
        """Refuse ids that repeat or that a request in flight holds."""
        if len(set(rids)) != len(rids):
            raise RequestError("request ids in a batch must be unique")
        for rid in rids:
            why = self._id_in_use(rid)
            if why is not None:
                raise RequestError(why)

    @contextlib.contextmanager
    def _reserve(self, rids: List[str]) -> Iterator[None]:
        """Hold every id a request will use, from its admission (before its first await) to its end, so that no
        request admitted meanwhile can take one: _send would refuse it then, too late to answer cleanly."""
        self._check_new_rids(rids)
        self._reserved.update(rids)
        try:
            yield
        finally:
            self._reserved.difference_update(rids)

    async def generate_request(self, obj: GenerateReqInput) -> AsyncIterator[Any]:
        """Yields output dicts: for a stream every update (each with "index" where the request has several samples:
        a batch, or n > 1), else one final dict (a list for a batch or n > 1)."""
        self.start()
        self._check_alive()
        items = [obj.item(i) for i in range(obj.batch_size())] if obj.is_batch else [obj]
        if not items:
            raise RequestError("the batch is empty")
        for it in items:  # cheap checks first, on the loop: no tokenizer work for a hopeless request
            if isinstance(it.text, str):
                self.check_text_size(it.text)
        tokenized = await self.run_cpu(self._tokenize_all, items)  # validate all before sending any
        self._check_alive()  # the engine may have died or started shutting down meanwhile
        parallel = any(t.sampling_params.n > 1 for t in tokenized)
        if (obj.is_batch or parallel) and obj.stream:
            async with contextlib.aclosing(self._stream_all(tokenized)) as outs:  # closed with this generator
                async for out in outs:
                    yield out
            return
        if obj.is_batch or parallel:
            # Awaited before the yield: the ids are free again when the caller has the outputs.
            yield await self._generate_all(tokenized)
            return
        (one,) = tokenized
        self._check_new_rids([one.rid])
        state = self._send(one)  # no await since the check: registered before any other request is admitted
        if not obj.stream:
            yield await self._wait_final(one.rid, state)
            return
        try:
            while True:
                await self._wait_event(one.rid, state)
                out = self._make_output(one.rid, state)
                # Decided before the yield: while the caller holds this chunk, the last update may arrive,
                # and reading the state after it would end the stream without sending that update.
                last = state.finished_reason is not None
                yield out
                if last:
                    break
        finally:
            self._forget(one.rid, state)

    @contextlib.asynccontextmanager
    async def _sent_all(self, prompts: List[TokenizedGenerateReqInput]) -> AsyncIterator[List[Tuple[str, ReqState]]]:
        """Send every sample of every prompt, prompt-major (as SGLang orders and numbers them); yields each
        sample's (id, state). A prompt with n > 1 is prefilled once first, so its samples find it in the radix
        cache instead of computing it n times. The prompts' ids and all the internal ones are reserved before the
        first await, until the caller is done."""
        samples: List[Tuple[str, TokenizedGenerateReqInput]] = []  # (the id its output shows, the request)
        warm: List[TokenizedGenerateReqInput] = []
        children: Dict[str, List[str]] = {}
        for t in prompts:
            mine = parallel_samples(t)
            samples += mine
            if t.sampling_params.n > 1:
                prefill = [prefill_only(t)] if not self.server_args.disable_radix_cache else []
                warm += prefill
                children[t.rid] = [w.rid for w in prefill] + [s.rid for _, s in mine]
        internal = [rid for kids in children.values() for rid in kids]
        with self._reserve([t.rid for t in prompts] + internal):
            self._children.update(children)  # an abort of the prompt's id reaches them, warm-up included
            try:
                if warm:
                    await asyncio.gather(*(self._wait_final(w.rid, self._send(w)) for w in warm))
                yield [(s.rid, self._send(s, shown)) for shown, s in samples]
            finally:
                for parent in children:
                    self._children.pop(parent, None)

    async def _generate_all(self, prompts: List[TokenizedGenerateReqInput]) -> List[dict]:
        """Every sample's final output, prompt-major. Awaited before the caller's yield: the ids are free again
        when the caller has the outputs."""
        async with self._sent_all(prompts) as sent:
            waits = [asyncio.ensure_future(self._wait_final(rid, state)) for rid, state in sent]
            try:
                return list(await asyncio.gather(*waits))
            finally:
                for wait in waits:  # one sample failed: the others are aborted (their waits forget them), not left
                    wait.cancel()

    async def _stream_all(self, prompts: List[TokenizedGenerateReqInput]) -> AsyncIterator[dict]:
        """Every sample's updates as they come, each output with "index", the sample's place in the prompt-major
        order (SGLang's batch streams: prompt i's sample j is i * n + j). One sample's error ends the stream,
        and leaving early aborts the samples not finished."""
        async with self._sent_all(prompts) as sent:
            waits: Dict[asyncio.Future, int] = {}
            try:
                for i, (rid, state) in enumerate(sent):
                    waits[asyncio.ensure_future(self._wait_event(rid, state))] = i
                while waits:
                    done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    ready = sorted(waits.pop(task) for task in done)
                    errors = [task.exception() for task in done]  # each read, so none is logged as never retrieved
                    error = next((e for e in errors if e is not None), None)
                    if error is not None:  # a sample's error (a refusal, its timeout) ends the stream
                        raise error
                    for i in ready:
                        rid, state = sent[i]
                        out = self._make_output(rid, state)
                        out["index"] = i
                        if state.finished_reason is None:  # decided before the yield, as for one stream
                            waits[asyncio.ensure_future(self._wait_event(rid, state))] = i
                        yield out
            finally:
                for wait in waits:
                    wait.cancel()
                for rid, state in sent:
                    self._forget(rid, state)

    def _send(self, tokenized: TokenizedGenerateReqInput, shown_rid: Optional[str] = None) -> ReqState:
        """Register the request's state and send it. An id in flight is refused, never taken over: its owner's
        outputs would go to this state and the owner would wait forever."""
        why = self._id_in_use(tokenized.rid, reserved_here=True)
        if why is not None:
            raise RequestError(why)
        state = ReqState(req=tokenized, shown_rid=shown_rid if shown_rid != tokenized.rid else None)
        self.rid_to_state[tokenized.rid] = state
        if self.server_args.log_requests and tokenized.log_metrics:
            logger.info(
                "Receive: rid=%s prompt_tokens=%d sampling_params=%s",
                shown_rid or tokenized.rid,
                len(tokenized.input_ids),
                tokenized.sampling_params.changed_fields(),
            )
        self.send_to_scheduler.send_pyobj(tokenized)
        return state

    async def _wait_event(self, rid: str, state: ReqState) -> None:
        """Wait for the next update of `rid`; raise its error, or a 503 past SGLANG_REQUEST_TIMEOUT_S."""
        timeout = None
        if self.request_timeout_s > 0:
            timeout = max(state.created + self.request_timeout_s - time.monotonic(), 0.0)
        try:
            if timeout is None:  # no timer to arm: wait_for would still cost a timeout scope per update
                await state.event.wait()
            else:
                await asyncio.wait_for(state.event.wait(), timeout)
        except asyncio.TimeoutError:
            self._forget(rid, state, f"timed out after {self.request_timeout_s:g} s (SGLANG_REQUEST_TIMEOUT_S)")
            raise RequestError(
                f"no result within {self.request_timeout_s:g} s (SGLANG_REQUEST_TIMEOUT_S); the request was aborted",
                503,
            ) from None
        state.event.clear()
        if state.error is not None:
            raise state.error

    async def _wait_final(self, rid: str, state: ReqState) -> dict:
        try:
            while state.finished_reason is None:
                await self._wait_event(rid, state)
            return self._make_output(rid, state)
        finally:
            self._forget(rid, state)

    def _forget(self, rid: str, state: ReqState, why: str = "client disconnected") -> None:
        """Drop the state; a request that has not finished (client gone) is aborted so its KV is freed."""
        if self.rid_to_state.get(rid) is state:
            del self.rid_to_state[rid]
            if state.finished_reason is None and self.fatal_error is None and not self._stopped:
                self._aborting.add(rid)
                self.send_to_scheduler.send_pyobj(AbortReq(rid, why, CLIENT_GONE_STATUS))

    def abort_request(self, rid: str) -> None:
        """Abort `rid` (a client went away); for a prompt with n > 1, all of its samples."""
        for one in [rid, *self._children.get(rid, [])]:
            state = self.rid_to_state.get(one)
            if state is not None:
                self._forget(one, state)

    def _make_output(self, rid: str, state: ReqState) -> dict:
        fr = state.finished_reason
        if (
            fr is not None
            and fr.get("type") == "abort"
            and fr.get("status_code", 0) >= 400
            and fr.get("status_code") != CLIENT_GONE_STATUS
        ):
            # Refused by the scheduler (400), out of memory (503), a failed batch (500): an HTTP error.
            raise RequestError(fr.get("message", "request aborted"), fr["status_code"])
        meta = dict(state.meta)
        meta.update(id=state.shown_rid or rid, finish_reason=fr, e2e_latency=time.monotonic() - state.created)
        req = state.req
        if req is not None and req.return_logprob:
            meta.update(self._logprob_meta(state))
        if req is not None and req.return_prompt_token_ids:
            meta["prompt_token_ids"] = list(req.input_ids)
        out = {"output_ids": list(state.output_ids), "meta_info": meta}
        if self.tokenizer is not None:
            out["text"] = state.text
        return out

    def _token_text(self, token_id: int) -> Optional[str]:
        text = self._token_texts.get(token_id)
        if text is None and self.tokenizer is not None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def _logprob_meta(self, state: ReqState) -> dict:
        """meta_info's logprob fields in SGLang's layout: lists of (logprob, token_id, text or None); top-k
        and chosen-id fields are per position lists of those (None where nothing predicts the token)."""
        req = state.req
        text = self._token_text if req.return_text_in_logprobs else (lambda tid: None)

        def entries(pairs):
            return None if pairs is None else [[lp, tid, text(tid)] for lp, tid in pairs]

        meta = {
            "input_token_logprobs": entries(state.prompt.get("input_token", [])),
            "output_token_logprobs": entries(zip(state.logprobs, state.output_ids)),
        }
        if req.top_logprobs_num:
            meta["input_top_logprobs"] = [entries(p) for p in state.prompt.get("input_top", [])]
            meta["output_top_logprobs"] = [entries(p) for p in state.output_top]
        if req.token_ids_logprob:
            meta["input_token_ids_logprobs"] = [entries(p) for p in state.prompt.get("input_ids", [])]
            meta["output_token_ids_logprobs"] = [entries(p) for p in state.output_chosen]
        return meta

    async def flush_cache(self) -> FlushCacheReqOutput:
        self.start()
        self._check_alive()
        fut = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(fut)
        self.send_to_scheduler.send_pyobj(FlushCacheReq())
        return await asyncio.wait_for(fut, timeout=30)
