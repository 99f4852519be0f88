"""DetokenizerManager: token ids -> incremental text, in its own process (decoding is CPU work)."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import zmq

from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenIDOut
from sglang.srt.sampling.stop_regex import StopRegexTimeout, held_back_from, match_start
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.fault_injection import FaultPlan
from sglang.srt.utils.process import (
    STARTUP_READY,
    PortArgs,
    ShutdownRequested,
    configure_logger,
    die_with_parent,
    raise_on_sigterm,
    reporting_startup,
)

logger = logging.getLogger(__name__)
DETOKENIZER_SOURCE = "detokenizer"  # marks an abort decided here: the scheduler must be told to stop the request


@dataclass
class DecodeStatus:
    ids: List[int]
    text: str = ""  # text confirmed so far
    surr_offset: int = 0  # decode from here so a token's leading space renders correctly
    read_offset: int = 0  # tokens before this are in `text`
    sent_len: int = 0  # characters already sent


class IncrementalDetokenizer:
    """Turns growing token lists into text deltas, holding back incomplete UTF-8 (U+FFFD) sequences."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: Dict[str, DecodeStatus] = {}

    def _decode(self, ids: List[int], skip: bool, spaces: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces)

    def step(
        self,
        rid: str,
        new_ids: List[int],
        finished: Optional[dict],
        skip: bool,
        spaces: bool,
        no_stop_trim: bool,
        stop_str_max_len: int = 0,
        stop_regexes: Sequence[str] = (),
    ) -> str:
        st = self.states.setdefault(rid, DecodeStatus(ids=[]))
        st.ids.extend(new_ids)
        ids = st.ids
        matched = finished.get("matched") if finished else None
        if finished and isinstance(matched, int) and not no_stop_trim and ids and ids[-1] == matched:
            ids = ids[:-1]  # the stop token itself is not part of the text
        surr = self._decode(ids[st.surr_offset : st.read_offset], skip, spaces)
        full = self._decode(ids[st.surr_offset :], skip, spaces)
        if finished or (len(full) > len(surr) and not full.endswith("\ufffd")):
            st.text += full[len(surr) :]
            st.surr_offset, st.read_offset = st.read_offset, len(ids)
        text = st.text
        if finished and isinstance(matched, str) and not no_stop_trim:
            # a stop string, or a stop regex (reported by its pattern): the text from its first match goes
            pos = match_start(matched, text) if matched in stop_regexes else text.find(matched)
            if pos is not None and pos >= 0:
                text = text[:pos]
        if not finished and not no_stop_trim:
            # A stop string or regex may be completing: hold back what it could still cut (a stop string's
            # length - 1 characters, a regex's possible match), so a stream never shows text the final
            # (trimmed) answer does not contain.
            keep = len(text) - max(stop_str_max_len - 1, 0)
            if stop_regexes:
                keep = min(keep, held_back_from(stop_regexes, text, st.sent_len))
            text = text[: max(st.sent_len, keep)]
        delta = text[st.sent_len :]
        st.sent_len = len(text)
        if finished:
            del self.states[rid]
        return delta

    def _step_or_fail(self, i: int, out: BatchTokenIDOut, finished: List[Optional[dict]]) -> str:
        """Decode request i; if its data cannot be decoded, fail that request alone (never the process)."""
        if self.tokenizer is None:
            return ""
        rid = out.rids[i]
        try:
            return self.step(
                rid,
                out.output_ids[i],
                out.finished_reasons[i],
                out.skip_special_tokens[i],
                out.spaces_between_special_tokens[i],
                out.no_stop_trim[i],
                out.stop_str_max_len[i],
                out.stop_regexes[i],
            )
        except StopRegexTimeout as e:
            # The request's own stop_regex is too costly (holding back text, or trimming the final answer): fail
            # it as the scheduler does (400, same message). Not holding back instead would stream text the final
            # answer may cut, and would spend the budget again on every later step.
            self.states.pop(rid, None)
            finished[i] = {"type": "abort", "status_code": 400, "source": DETOKENIZER_SOURCE, "message": str(e)}
            return ""
        except Exception as e:  # noqa: BLE001 - one request's bad data must not take the detokenizer down
            logger.exception("Detokenizing request %s failed; it is aborted", rid)
            self.states.pop(rid, None)
            finished[i] = {
                "type": "abort",
                "status_code": 500,
                "source": DETOKENIZER_SOURCE,
                "message": f"the detokenizer could not decode this request's output: {type(e).__name__}: {e}",
            }
            return ""

    def process(self, out: BatchTokenIDOut) -> BatchStrOut:
        finished = list(out.finished_reasons)
        strs = [self._step_or_fail(i, out, finished) for i in range(len(out.rids))]
        return BatchStrOut(
            rids=out.rids,
            output_strs=strs,
            output_ids=out.output_ids,
            finished_reasons=finished,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            output_token_logprobs=out.output_token_logprobs,
            first_token_times=out.first_token_times,
            queue_times=out.queue_times,
            logprob_extras=out.logprob_extras,
        )


def run_detokenizer_process(
    server_args: ServerArgs, port_args: PortArgs, backend_json_path: Optional[str], pipe
) -> None:
    """`backend_json_path`: a file with the launcher's tokenizer when decoding it needs no transformers
    (utils/backend_decoder.py); None: load the tokenizer here."""
    die_with_parent()
    raise_on_sigterm()
    configure_logger(server_args.log_level, prefix="detokenizer")
    with reporting_startup(pipe, "Detokenizer"):
        faults = FaultPlan.from_env()
        tokenizer = None
        if backend_json_path is not None:
            from sglang.srt.utils.backend_decoder import BackendDecoder

            tokenizer = BackendDecoder.from_file(backend_json_path)
        elif not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_tokenizer import get_tokenizer

            tokenizer = get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
        ctx = zmq.Context(2)
        recv = ctx.socket(zmq.PULL)
        recv.bind(port_args.detokenizer_ipc_name)
        send = ctx.socket(zmq.PUSH)
        send.connect(port_args.tokenizer_ipc_name)
        detok = IncrementalDetokenizer(tokenizer)
        faults.at_startup("detokenizer")
        pipe.send({"status": STARTUP_READY})
    try:
        count = 0
        while True:
            msg = recv.recv_pyobj()
            count += 1
            faults.on_detokenizer_message(count)
            send.send_pyobj(detok.process(msg))
    except ShutdownRequested:
        raise SystemExit(0) from None
    except BaseException:
        logger.error("Detokenizer failed:\n%s", traceback.format_exc())
        raise SystemExit(1) from None
