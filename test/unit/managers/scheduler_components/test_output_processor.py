from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# OutputStreamer: every logprob leaves the scheduler floored at LOGPROB_FLOOR (-9999.0, vLLM's floor), so a
# token the grammar masks (logprob -inf) reaches the client as a finite number: once it was a 500 ("Out of range
# float values are not JSON compliant") without streaming and "-Infinity" (invalid JSON) in streamed events.

import json
import math

from sglang.srt.managers.schedule_batch import FinishReason, Req
from sglang.srt.managers.scheduler_components.output_processor import LOGPROB_FLOOR, OutputStreamer
from sglang.srt.sampling.sampling_params import SamplingParams

INF = float("inf")


def test_masked_tokens_logprobs_are_floored_in_every_field():
    req = Req("r", [5, 6, 7], SamplingParams(), [2], 0, return_logprob=True)
    req.top_logprobs_num, req.token_ids_logprob, req.logprob_start_len = 2, [11, 12], 0
    req.output_ids = [3, 4]
    req.output_token_logprobs = [-0.5, -INF]
    req.output_top_logprobs = [[(-0.5, 3), (-INF, 9)], [(-INF, 4), (-INF, 9)]]
    req.output_token_ids_logprobs = [[(-INF, 11), (-1.0, 12)], [(-INF, 11), (-INF, 12)]]
    got = req.input_logprobs
    got.token += [(None, 5), (-INF, 6), (-2.0, 7)]
    got.top += [None, [(-INF, 6), (-3.0, 1)], [(-2.0, 7), (-INF, 1)]]
    got.chosen += [None, [(-INF, 11), (-4.0, 12)], [(-1.0, 11), (-INF, 12)]]
    req.input_logprobs_done = True
    req.finished_reason = FinishReason("length", length=2)
    sent = []
    OutputStreamer(sent.append, stream_interval=1).stream([req])
    (out,) = sent
    assert out.output_token_logprobs == [[-0.5, LOGPROB_FLOOR]]
    extras = out.logprob_extras[0]
    assert extras["output_top"] == [[(-0.5, 3), (LOGPROB_FLOOR, 9)], [(LOGPROB_FLOOR, 4), (LOGPROB_FLOOR, 9)]]
    assert extras["output_ids"][1] == [(LOGPROB_FLOOR, 11), (LOGPROB_FLOOR, 12)]
    assert extras["input_token"] == [(None, 5), (LOGPROB_FLOOR, 6), (-2.0, 7)]  # None: nothing predicts token 0
    assert extras["input_top"][0] is None and extras["input_top"][1] == [(LOGPROB_FLOOR, 6), (-3.0, 1)]
    assert extras["input_ids"][2] == [(-1.0, 11), (LOGPROB_FLOOR, 12)]
    # Every value is JSON now (the response encoders refuse NaN and infinities).
    json.dumps([out.output_token_logprobs, extras], allow_nan=False)
    # The request keeps its own values: only what leaves the scheduler is floored.
    assert math.isinf(req.output_token_logprobs[1])
