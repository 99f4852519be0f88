from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

# stop_regex through the scheduler's token-by-token check (OutputProcessor.append_token on a Req) and the
# detokenizer (SmolLM2's tokenizer): the request stops at the token completing the first match, the text from
# the match on is trimmed (kept with no_stop_trim), a bounded pattern is matched on a short tail, and the
# streamed pieces never show text the final answer cuts: they join to the non-streamed answer. A pattern
# that backtracks catastrophically runs out of its time budget and fails its request alone (400), promptly.

import time

import pytest

from sglang.srt.environ import envs
from sglang.srt.managers.detokenizer_manager import IncrementalDetokenizer
from sglang.srt.managers.io_struct import BatchTokenIDOut, SchedulerStats
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler_components.output_processor import OutputProcessor
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.stop_regex import (
    UNBOUNDED,
    StopRegexTimeout,
    first_match,
    held_back_from,
    match_start,
    parse_stop_regex,
)
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(SMOLLM2)


def run(tokenizer, text: str, params: dict):
    """Feed `text`'s tokens one by one as the scheduler would; (tokens taken, finish reason, streamed
    deltas, the non-streamed text)."""
    sp = SamplingParams.from_dict({"max_new_tokens": 200, **params})
    req = Req("r", [1], sp, [tokenizer.eos_token_id], 0)
    outputs = OutputProcessor(None, tokenizer, SchedulerStats())
    streamed, whole = IncrementalDetokenizer(tokenizer), IncrementalDetokenizer(tokenizer)
    deltas = []
    for tok in tokenizer.encode(text, add_special_tokens=False):
        outputs.append_token(req, tok, 0.0)
        finish = req.finished_reason.to_json() if req.finished() else None
        deltas.append(
            streamed.step("s", [tok], finish, True, True, sp.no_stop_trim, sp.stop_str_max_len, sp.stop_regexes)
        )
        if finish:
            break
    final = whole.step("w", req.output_ids, finish, True, True, sp.no_stop_trim, sp.stop_str_max_len, sp.stop_regexes)
    return len(req.output_ids), finish, deltas, final


def test_stops_at_the_match_and_trims_it_streamed_and_not(tokenizer):
    text = "The answer is 42 apples. Then more text follows here."
    n, finish, deltas, final = run(tokenizer, text, {"stop_regex": [r"\d+ [a-z]+\."]})
    assert finish == {"type": "stop", "matched": r"\d+ [a-z]+\."}  # upstream reports the pattern
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:n]).endswith("apples.")
    assert final == "The answer is " and "".join(deltas) == final
    shown = ""
    for d in deltas:
        shown += d
        assert final.startswith(shown)  # nothing shown was taken back: "42" waited for the match to decide


def test_no_stop_trim_keeps_the_match(tokenizer):
    _, finish, deltas, final = run(tokenizer, "Count: 1, 2, 3. Done", {"stop_regex": r"3\.", "no_stop_trim": True})
    assert finish["matched"] == r"3\." and final == "Count: 1, 2, 3." == "".join(deltas)


def test_unmatched_regex_streams_everything(tokenizer):
    text = "Nothing to see here, keep going"
    n, finish, deltas, final = run(tokenizer, text, {"stop_regex": ["END$", "x{3}"]})
    assert finish is None and n == len(tokenizer.encode(text, add_special_tokens=False))
    assert "".join(deltas) == text  # the last piece came with the finishing step


def test_stop_strings_and_regexes_together(tokenizer):
    _, finish, _, final = run(tokenizer, "alpha beta GAMMA delta", {"stop": ["delta"], "stop_regex": "[A-Z]{3,}"})
    assert finish["matched"] == "[A-Z]{3,}" and final == "alpha beta "


def test_match_lengths_and_hold_back():
    assert parse_stop_regex(r"ab\d")[1] == 3 and parse_stop_regex(["a", r"\d{2,5}"])[1] == 5
    assert parse_stop_regex(r"a\d+")[1] == UNBOUNDED  # matched on the whole output
    assert held_back_from(["abc"], "xxab", 0) == 2 and held_back_from(["abc"], "xxaq", 0) == 4
    assert held_back_from([r"\d+\."], "id 12", 0) == 3


# Exponential backtracking: every split of a run of "=" into "=" and "==" is tried before the match fails.
PATHOLOGICAL = "(=|==)+[^=]"
EQUALS = "=" * 256  # what 4 tokens of SmolLM2's 28909 (64 "=") decode to


def assert_prompt(started: float) -> None:
    assert time.monotonic() - started < 2.0, "a pathological stop_regex was not cut short by its budget"


@pytest.mark.parametrize(
    "search",
    [
        lambda: first_match(["x", PATHOLOGICAL], EQUALS),
        lambda: match_start(PATHOLOGICAL, EQUALS),
        lambda: held_back_from([PATHOLOGICAL], EQUALS, 0),  # the partial search backtracks too
    ],
    ids=["first_match", "match_start", "held_back_from"],
)
def test_pathological_pattern_times_out_with_a_clear_error(search):
    started = time.monotonic()
    with pytest.raises(StopRegexTimeout, match=r"stop_regex '\(=\|==\)\+\[\^=\]' took longer than .* ms"):
        search()
    assert_prompt(started)


def test_budget_is_shared_by_a_requests_patterns():
    # 8 patterns with 300 ms each would take 2.4 s; one budget for the whole check ends it after ~0.3 s
    with envs.SGLANG_STOP_REGEX_TIMEOUT_MS.override(300):
        started = time.monotonic()
        with pytest.raises(StopRegexTimeout, match="300 ms"):
            first_match([PATHOLOGICAL + "x" * i for i in range(8)], EQUALS)
        assert time.monotonic() - started < 1.5


def test_scheduler_fails_only_that_request_with_400(tokenizer):
    started = time.monotonic()
    n, finish, deltas, final = run(tokenizer, EQUALS, {"stop_regex": PATHOLOGICAL})
    assert_prompt(started)
    assert finish["type"] == "abort" and finish["status_code"] == 400
    assert "stop_regex" in finish["message"] and "simplify the pattern" in finish["message"]
    assert n == 1  # ended at the first token: it takes no further step (the HTTP layer answers the 400)


def batch_out(rids, output_ids, stop_regexes) -> BatchTokenIDOut:
    k = len(rids)
    return BatchTokenIDOut(
        rids=rids,
        output_ids=output_ids,
        finished_reasons=[None] * k,
        prompt_tokens=[1] * k,
        completion_tokens=[len(ids) for ids in output_ids],
        cached_tokens=[0] * k,
        output_token_logprobs=[[] for _ in rids],
        skip_special_tokens=[True] * k,
        spaces_between_special_tokens=[True] * k,
        no_stop_trim=[False] * k,
        stop_str_max_len=[0] * k,
        stop_regexes=stop_regexes,
        first_token_times=[None] * k,
        queue_times=[None] * k,
        logprob_extras=[None] * k,
    )


def test_detokenizer_fails_only_that_request_with_400(tokenizer):
    # The scheduler's check passed (say), but holding back streamed text is too costly: that request is failed
    # (400, same message) and dropped; the other request of the batch streams as usual.
    detok = IncrementalDetokenizer(tokenizer)
    hello = tokenizer.encode("Hello there", add_special_tokens=False)
    started = time.monotonic()
    out = detok.process(batch_out(["bad", "good"], [[28909] * 4, hello], [[PATHOLOGICAL], [r"\d+"]]))
    assert_prompt(started)
    bad, good = out.finished_reasons
    assert bad["type"] == "abort" and bad["status_code"] == 400 and "stop_regex" in bad["message"]
    assert bad["source"] == "detokenizer"  # so the tokenizer manager stops it in the scheduler too
    assert good is None and out.output_strs == ["", "Hello there"] and list(detok.states) == ["good"]
