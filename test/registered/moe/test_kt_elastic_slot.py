"""The elastic KT prefill slot's scheduling on the CPU (tiny random Qwen3-MoE, KT BF16, 3 of 8 experts
local), with an injected arena: on the GPU the arena moves the pool's tail memory into the slot's range
(test/unit/mem_cache/test_vmm.py, test_vmm_cuda.py); here it hands out host bytes, so the allocator, the
radix cache, the KT state and the scheduler's decisions run for real:

- a long prompt takes the tail (its slot's parameters are views of the lent memory), keeps it over its
  chunks, gives it back after, and generates exactly what a permanently reserved slot generates;
- radix-cached pages in the tail are evicted so the tail can be lent;
- while running requests hold tail pages, long prompts take the hybrid path and nothing fails; once the
  tail is free again the next long prompt takes it.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

import pytest
import torch

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler_components.kt_prefill_slot_lender import KTPrefillSlotLender
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.runners import make_tiny_qwen3_moe

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
LONG = [20 + (7 * i) % 200 for i in range(20)]
NEW_TOKENS = 8
THRESHOLD = 8  # prefill batches of >= 8 tokens take KT's full-GPU path
SLOT = "kt_full_gpu_prefill_slot"


class LendingArena:
    """Stands for VirtualKVArena's tail lending: the slot's memory is host bytes, nothing is remapped."""

    def __init__(self, nbytes: int) -> None:
        self.memory = torch.zeros(nbytes, dtype=torch.uint8)
        self.lent, self.calls = False, []

    def lend_tail(self) -> None:
        assert not self.lent
        self.lent = True
        self.calls.append("lend")

    def return_tail(self) -> None:
        assert self.lent
        self.lent = False
        self.calls.append("return")

    def slot_tensor(self) -> torch.Tensor:
        assert self.lent, "the slot's memory exists only while lent"
        return self.memory


@pytest.fixture(scope="module")
def model_dir():
    return make_tiny_qwen3_moe(seed=0)[0]


def make(path: str, non_tail_tokens=None, chunk=None):
    """A scheduler whose pool's last pages are lendable (all but `non_tail_tokens`), or a permanent slot (None)."""
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.managers.scheduler import build_scheduler
    from sglang.srt.server_args import ServerArgs
    from sglang.test.runners import OutputCollector

    kw = {"chunked_prefill_size": chunk} if chunk else {}
    args = ServerArgs(
        model_path=path, skip_tokenizer_init=True, max_total_tokens=2048, log_level="warning", kt_method="BF16",
        kt_num_gpu_experts=3, kt_gpu_prefill_token_threshold=THRESHOLD, **kw,
    )  # fmt: skip
    collector = OutputCollector()
    sched = build_scheduler(resolve_engine_config(args), output_sink=collector)
    arena = None
    if non_tail_tokens is not None:
        sched.allocator.resize(sched.allocator.size, lendable_tail_pages=sched.allocator.size - non_tail_tokens)
        arena = LendingArena(sched.model_runner.memory_plan.reservations_bytes[SLOT])
        slot = sched.model_runner.kt_prefill_slot
        sched.kt_slot_lender = KTPrefillSlotLender(arena, sched.allocator, sched.tree_cache, slot, THRESHOLD)
    return sched, collector, arena


def submit(sched, rid: str, ids, new_tokens: int = NEW_TOKENS) -> None:
    params = SamplingParams.from_dict({"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True})
    sched.add_request(TokenizedGenerateReqInput(rid, "", list(ids), params, False, False))


def finish(sched) -> None:
    while sched.has_work():
        sched.step()


def no_slot_leaked(sched) -> bool:
    a = sched.allocator
    return not a.tail_lent and a.available_size() + sched.tree_cache.evictable_size() == a.size


def test_long_prompt_takes_the_tail_keeps_it_over_its_chunks_and_gives_it_back(model_dir):
    permanent, out_p, _ = make(model_dir, chunk=8)
    submit(permanent, "long", LONG)
    finish(permanent)
    sched, out, arena = make(model_dir, non_tail_tokens=1024, chunk=8)
    slot = sched.model_runner.kt_prefill_slot
    submit(sched, "long", LONG)
    sched.step()  # the first of three 8-token chunks: the slot is taken, and kept for the next chunks
    assert arena.calls == ["lend"] and sched.allocator.tail_lent
    memory = arena.memory
    for p in slot.layer.parameters():  # built over the lent bytes, not allocated
        assert memory.data_ptr() <= p.data_ptr() < memory.data_ptr() + memory.numel()
    finish(sched)
    assert arena.calls == ["lend", "return"] and slot.layer is None
    stats = sched.kt_slot_lender.stats
    assert (stats.takes, stats.returns, stats.refusals, stats.lent) == (1, 1, 0, False)
    assert out.results["long"].output_ids == out_p.results["long"].output_ids  # greedy: elastic == permanent
    assert no_slot_leaked(sched)


def test_cached_tail_pages_are_evicted_before_lending(model_dir, monkeypatch):
    sched, out, arena = make(model_dir, non_tail_tokens=16)
    for i in range(3):  # one by one (each batch below the threshold); their cached pages spill into the tail
        submit(sched, f"short-{i}", [40 + i] * 6, new_tokens=4)
        finish(sched)
    assert arena.calls == []
    cached_in_tail = sched.allocator.tail_pages_in_use()  # only the radix tree holds pages now
    assert cached_in_tail > 0
    evictions, evict_slots = [], sched.tree_cache.evict_slots

    def recording(lo: int, hi: int) -> bool:
        before = sched.tree_cache.evictable_size()
        ok = evict_slots(lo, hi)
        evictions.append((ok, before - sched.tree_cache.evictable_size()))
        return ok

    monkeypatch.setattr(sched.tree_cache, "evict_slots", recording)
    submit(sched, "long", PROMPT)
    sched.step()  # its prefill: the cached tail pages are evicted, then the tail is lent
    assert evictions == [(True, evictions[0][1])] and evictions[0][1] >= cached_in_tail
    assert arena.calls == ["lend", "return"] and sched.kt_slot_lender.stats.refusals == 0
    finish(sched)
    assert len(out.results["long"].output_ids) == NEW_TOKENS and no_slot_leaked(sched)


def test_held_tail_means_hybrid_and_no_failure(model_dir):
    permanent, out_p, _ = make(model_dir)
    submit(permanent, "long", PROMPT)
    finish(permanent)
    sched, out, arena = make(model_dir, non_tail_tokens=16)
    for i in range(3):  # 6-token prompts one step apart (each prefill below the threshold), decoding 12 tokens
        submit(sched, f"busy-{i}", [60 + i] * 6, new_tokens=12)
        sched.step()
    assert sched.allocator.tail_pages_in_use() > 0 and arena.calls == []  # 18 + tokens > the 16 outside the tail
    submit(sched, "long", PROMPT)
    sched.step()  # the long prompt's prefill: the tail is held, so it runs hybrid
    assert arena.calls == [] and sched.kt_slot_lender.stats.refusals == 1
    finish(sched)
    assert all(len(r.output_ids) == (NEW_TOKENS if rid == "long" else 12) for rid, r in out.results.items())
    assert all(r.finish_reason["type"] == "length" for r in out.results.values())
    assert out.results["long"].output_ids == out_p.results["long"].output_ids  # hybrid == full-GPU (fp32, CPU)
    submit(sched, "again", PROMPT)  # the tail is free again: this one takes the slot
    finish(sched)
    assert arena.calls == ["lend", "return"] and no_slot_leaked(sched)
