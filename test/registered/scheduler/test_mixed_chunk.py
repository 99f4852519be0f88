from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

# Mixed chunks (--enable-mixed-chunk) on SmolLM2 (real weights, CPU): running requests take their decode step
# inside the prefill batches of newly arrived prompts.
#   * while a long prompt prefills in chunks, every chunk also advances the running requests by one token;
#   * greedy outputs equal those without mixing, with overlap scheduling on and off, chunked prefill and
#     pages of 4 tokens; every KV slot is accounted for afterwards.

import pytest

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2, greedy_params, make_scheduler

NEW = 16
EARLY = "What is the capital of France?"
LATE = [
    "Name three colours.",
    "Why is the sky blue? Explain it to a child, in detail, with two examples and a short summary at the end.",
    "hi",
]


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer(SMOLLM2)


def staggered_run(tok, mixed: bool, overlap: bool):
    """One request decodes alone for three steps, then three more arrive (one long: several 8-token chunks).
    Returns the outputs and, per launched batch, (mode, requests, running decodes riding along)."""
    sched = make_scheduler(
        model_path=SMOLLM2,
        max_total_tokens=4096,
        chunked_prefill_size=8,
        page_size=4,
        enable_mixed_chunk=mixed,
        disable_overlap_schedule=not overlap,
    )
    launched = []
    run_batch = sched.run_batch

    def logged(batch):
        launched.append((batch.forward_mode.name, batch.batch_size(), batch.num_decode))
        return run_batch(batch)

    sched.run_batch = logged
    tag = f"{int(mixed)}{int(overlap)}"
    finished_at = {}  # rid -> forwards launched when its last output was sent
    sink = sched.streamer.sink  # the output streamer's sink (the collector): wrapped to time each finish

    def timed_sink(out):
        for rid, reason in zip(out.rids, out.finished_reasons):
            if reason is not None:
                finished_at[rid.split("-")[1]] = sched.forward_ct
        sink(out)

    sched.streamer.sink = timed_sink

    def submit(i, text):
        params = SamplingParams.from_dict(greedy_params(NEW))
        sched.add_request(TokenizedGenerateReqInput(f"{tag}-{i}", "", tok.encode(text), params, False, False))

    submit(0, EARLY)
    for _ in range(3):
        sched.step()
    for i, text in enumerate(LATE, start=1):
        submit(i, text)
    while sched.has_work():
        sched.step()
    outs = [sched.collector.results.pop(f"{tag}-{i}") for i in range(1 + len(LATE))]
    tree, alloc = sched.tree_cache, sched.allocator
    assert alloc.available_size() + tree.evictable_size() == sched.max_total_num_tokens
    assert tree.protected_size() == 0 and sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size
    return outs, launched, finished_at


@pytest.mark.parametrize("overlap", [True, False])
def test_mixed_chunks_keep_running_requests_decoding(tok, overlap):
    plain, plain_batches, plain_done = staggered_run(tok, mixed=False, overlap=overlap)
    mixed, mixed_batches, mixed_done = staggered_run(tok, mixed=True, overlap=overlap)
    for i, (a, b) in enumerate(zip(plain, mixed)):
        assert a.output_ids == b.output_ids and len(a.output_ids) == NEW, f"request {i}"
        assert a.finish_reason == b.finish_reason
    # Without mixing no prefill carries a decode; with it, every prefill after the first carries the running ones.
    assert all(n == 0 for _, _, n in plain_batches)
    prefills = [(size, n) for mode, size, n in mixed_batches if mode == "EXTEND"]
    assert len(prefills) >= 4  # the first prompt, then the late ones in several chunks
    assert all(n >= 1 for _, n in prefills[1:]), prefills
    # The running request no longer waits through the prefill chunks: it finishes that many forwards earlier.
    chunks = len(prefills) - 1
    assert mixed_done["0"] <= plain_done["0"] - chunks, (mixed_done, plain_done)
