from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

# stop_regex through the scheduler's token-by-token check (OutputProcessor.append_token on a Req) and the
# detokenizer (SmolLM2's tokenizer): the request stops at the token completing the first match, the text from
# the match on is trimmed (kept with no_stop_trim), a bounded pattern is matched on a short tail, and the
# streamed pieces never show text the final answer cuts: they join to the non-streamed answer.

import pytest

from sglang.srt.managers.detokenizer_manager import IncrementalDetokenizer
from sglang.srt.managers.io_struct import SchedulerStats
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler_components.output_processor import OutputProcessor
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.stop_regex import UNBOUNDED, held_back_from, parse_stop_regex
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
