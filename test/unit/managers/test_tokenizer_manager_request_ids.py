"""Request ids in TokenizerManager: no request can take over another's state. An n > 1 prompt reserves its own id,
its warm-up prefill's and its samples' before its first await; those internal ids are random (as upstream's
`regenerate_rid`), so a client can neither name nor collide with them; `_send` refuses an id in flight. A streamed
batch or n > 1 request yields every sample's outputs as they come, each with its index, and ends (aborting the rest)
on one sample's error or when its caller leaves.

A fake scheduler (both ZeroMQ ends of the real one) finishes requests at once, or holds those a test names, so
every interleaving below is exact. Each wait is bounded: a hang fails the test instead of stalling it."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

import asyncio
import dataclasses
from typing import Callable, List

import pytest
import zmq
import zmq.asyncio

from sglang.srt.managers.io_struct import AbortReq, BatchStrOut, GenerateReqInput, TokenizedGenerateReqInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.process import PortArgs

WAIT_S = 10.0  # every wait is bounded: a request that would hang fails the test instead


class FakeScheduler:
    """Finishes each request with max_new_tokens tokens, except those `hold` picks: they wait for `release()`."""

    def __init__(self, port_args: PortArgs) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(port_args.scheduler_input_ipc_name)
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.connect(port_args.tokenizer_ipc_name)
        self.received: List[TokenizedGenerateReqInput] = []
        self.held: List[TokenizedGenerateReqInput] = []
        self.aborted: List[str] = []
        self.hold: Callable[[TokenizedGenerateReqInput], bool] = lambda req: False

    async def run(self) -> None:
        while True:
            msg = await self.pull.recv_pyobj()
            if isinstance(msg, AbortReq):
                self.aborted.append(msg.rid)
            elif isinstance(msg, TokenizedGenerateReqInput):
                self.received.append(msg)
                (self.held.append if self.hold(msg) else self.finish)(msg)

    def finish(self, req: TokenizedGenerateReqInput) -> None:
        n = req.sampling_params.max_new_tokens
        self.push.send_pyobj(
            BatchStrOut(
                rids=[req.rid],
                output_strs=["x" * n],
                output_ids=[[7] * n],
                finished_reasons=[{"type": "length", "length": n}],
                prompt_tokens=[len(req.input_ids)],
                completion_tokens=[n],
                cached_tokens=[0],
                output_token_logprobs=[[0.0] * n],
                first_token_times=[None],
                queue_times=[None],
                logprob_extras=[None],
            )
        )

    def fail(self, which: Callable[[TokenizedGenerateReqInput], bool], message: str) -> None:
        """End the held requests `which` picks as the scheduler ends a refused one (an abort with a 400)."""
        for req in [req for req in self.held if which(req)]:
            self.held.remove(req)
            self.push.send_pyobj(
                BatchStrOut(
                    rids=[req.rid],
                    output_strs=[""],
                    output_ids=[[]],
                    finished_reasons=[{"type": "abort", "status_code": 400, "message": message}],
                    prompt_tokens=[len(req.input_ids)],
                    completion_tokens=[0],
                    cached_tokens=[0],
                    output_token_logprobs=[[]],
                    first_token_times=[None],
                    queue_times=[None],
                    logprob_extras=[None],
                )
            )

    def release(self, which: Callable[[TokenizedGenerateReqInput], bool] = lambda req: True) -> None:
        go = [req for req in self.held if which(req)]
        self.held = [req for req in self.held if not which(req)]
        for req in go:
            self.finish(req)


def is_warmup(req: TokenizedGenerateReqInput) -> bool:
    return req.sampling_params.max_new_tokens == 0


async def until(cond: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), WAIT_S)


def generate(tm: TokenizerManager, **fields) -> "asyncio.Task":
    """The first (for these non-streamed requests, the only) output of /generate, as a task."""
    return asyncio.ensure_future(asyncio.wait_for(tm.generate_request(GenerateReqInput(**fields)).__anext__(), WAIT_S))


def run_with_engine(test: Callable, disable_radix_cache: bool = False) -> None:
    async def main() -> None:
        args = ServerArgs(
            model_path="SmolLM2-135M-Instruct", disable_radix_cache=disable_radix_cache, skip_tokenizer_init=True
        )
        ports = PortArgs.init_new()
        info = {"context_len": 8192, "vocab_size": 49152, "max_total_num_tokens": 16384}
        tm = TokenizerManager(args, ports, info)
        fake = FakeScheduler(ports)
        loop_task = asyncio.ensure_future(fake.run())
        tm.start()
        try:
            await test(tm, fake)
        finally:
            loop_task.cancel()
            await tm.stop()
            fake.ctx.destroy(linger=0)

    asyncio.run(main())


PROMPT = list(range(100, 140))


def test_hidden_warmup_id_cannot_be_taken():
    """Repro A: a request named like the old warm-up id (`abc-prefill`) is in flight when `abc` with n = 2
    starts: both finish, each with its own outputs."""

    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = lambda req: req.rid == "abc-prefill"
        first = generate(tm, input_ids=PROMPT, rid="abc-prefill", sampling_params={"max_new_tokens": 6})
        await until(lambda: fake.held)
        second = generate(tm, input_ids=PROMPT, rid="abc", sampling_params={"max_new_tokens": 4, "n": 2})
        outs = await second
        assert [o["meta_info"]["id"] for o in outs] == ["abc-0", "abc-1"]
        assert all(len(o["output_ids"]) == 4 for o in outs)
        internal = [r.rid for r in fake.received if r.rid not in ("abc-prefill",)]
        assert len(internal) == 3 and not any(rid.startswith("abc") for rid in internal)  # warm-up + 2 samples
        fake.release()
        out = await first
        assert out["meta_info"]["id"] == "abc-prefill" and len(out["output_ids"]) == 6

    run_with_engine(test)


def test_sample_id_taken_during_warmup():
    """Repro B: `job3-0` arrives while `job3` (n = 2) waits for its warm-up prefill, and is still running when
    job3's samples start: both finish with their own outputs (before: job3's first sample, named `job3-0`,
    overwrote the other request's state, which then never answered)."""

    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = lambda req: is_warmup(req) or req.rid == "job3-0"
        a = generate(tm, input_ids=PROMPT, rid="job3", sampling_params={"max_new_tokens": 8, "n": 2})
        await until(lambda: len(fake.held) == 1)
        b = generate(tm, input_ids=PROMPT, rid="job3-0", sampling_params={"max_new_tokens": 40})
        await until(lambda: len(fake.held) == 2)
        fake.release(is_warmup)  # job3's samples go out while job3-0 still runs
        outs = await a
        assert [o["meta_info"]["id"] for o in outs] == ["job3-0", "job3-1"]
        assert all(len(o["output_ids"]) == 8 for o in outs)
        fake.release()
        out = await b
        assert out["meta_info"]["id"] == "job3-0" and len(out["output_ids"]) == 40
        assert not tm.rid_to_state and not tm._reserved and not tm._children

    run_with_engine(test)


def test_reserved_ids_are_refused_until_the_request_ends():
    """While `job` (n = 2) waits for its warm-up, its own id and its internal ids are in flight: a request that
    names one gets 400 naming it. Once `job` has answered, the id is free at once."""

    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = is_warmup
        a = generate(tm, input_ids=PROMPT, rid="job", sampling_params={"max_new_tokens": 2, "n": 2})
        await until(lambda: fake.held)
        warmup_rid = fake.held[0].rid
        for rid in ("job", warmup_rid):
            with pytest.raises(RequestError, match=f"request id '{rid}' is already in flight") as e:
                await generate(tm, input_ids=PROMPT, rid=rid, sampling_params={"max_new_tokens": 2})
            assert e.value.status_code == 400
        with pytest.raises(RequestError, match="'job' is already in flight"):  # in a batch too
            await generate(tm, input_ids=[PROMPT, PROMPT], rid=["other", "job"], sampling_params={"max_new_tokens": 2})
        assert "other" not in tm._reserved  # a refused batch reserves nothing
        fake.hold = lambda req: False
        fake.release()
        assert len(await a) == 2
        again = await generate(tm, input_ids=PROMPT, rid="job", sampling_params={"max_new_tokens": 2, "n": 2})
        assert len(again) == 2

    run_with_engine(test)


def test_send_never_takes_over_a_state_in_flight():
    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = lambda req: True
        a = generate(tm, input_ids=PROMPT, rid="mine", sampling_params={"max_new_tokens": 3})
        await until(lambda: fake.held)
        state = tm.rid_to_state["mine"]
        with pytest.raises(RequestError, match="'mine' is already in flight"):
            tm._send(dataclasses.replace(fake.held[0]))
        assert tm.rid_to_state["mine"] is state and len(fake.received) == 1
        fake.release()
        assert len((await a)["output_ids"]) == 3

    run_with_engine(test)


def test_without_radix_cache_samples_still_reserved():
    """--disable-radix-cache: no warm-up; the batch's ids are still reserved and checked."""

    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = lambda req: True
        a = generate(tm, input_ids=[PROMPT, PROMPT], rid=["p", "q"], sampling_params={"max_new_tokens": 2, "n": 2})
        await until(lambda: len(fake.held) == 4)
        assert not any(is_warmup(r) for r in fake.received)
        with pytest.raises(RequestError, match="'q' is already in flight"):
            await generate(tm, input_ids=PROMPT, rid="q", sampling_params={"max_new_tokens": 2})
        fake.release()
        assert [o["meta_info"]["id"] for o in await a] == ["p-0", "p-1", "q-0", "q-1"]

    run_with_engine(test, disable_radix_cache=True)


def test_client_gone_during_warmup_aborts_it():
    """Cancelling an n > 1 request in its warm-up (the client left) aborts the warm-up and frees its ids."""

    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = is_warmup
        a = generate(tm, input_ids=PROMPT, rid="gone", sampling_params={"max_new_tokens": 2, "n": 3})
        await until(lambda: fake.held)
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        tm.abort_request("gone")
        await until(lambda: fake.aborted == [fake.held[0].rid])
        assert not tm.rid_to_state and not tm._reserved and not tm._children

    run_with_engine(test)


def test_an_aborted_id_is_refused_until_its_end_arrives():
    """A client leaves `late` while the scheduler still runs it; `late`'s final output comes after the abort. A new
    request under the same id before then is refused (it would have received that output and finished as the old
    one's abort); once the old end has arrived, the id is free and the new request gets its own output."""

    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = lambda req: req.rid == "late"
        a = generate(tm, input_ids=PROMPT, rid="late", sampling_params={"max_new_tokens": 5})
        await until(lambda: fake.held)
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        tm.abort_request("late")
        await until(lambda: fake.aborted == ["late"])
        with pytest.raises(RequestError, match="'late' is still in flight: aborted") as e:
            await generate(tm, input_ids=PROMPT, rid="late", sampling_params={"max_new_tokens": 3})
        assert e.value.status_code == 400
        fake.hold = lambda req: False
        fake.release()  # the old request's end (here its 5 tokens) reaches no state and frees the id
        await until(lambda: not tm._aborting)
        out = await generate(tm, input_ids=PROMPT, rid="late", sampling_params={"max_new_tokens": 3})
        assert out["meta_info"]["id"] == "late" and len(out["output_ids"]) == 3

    run_with_engine(test)


def test_batch_stream_yields_each_sample_by_index_as_it_ends():
    """Two prompts with n = 2, streamed: every output names its sample's place in the prompt-major order and its
    shown id; they come in the order the samples end, not in index order."""

    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = lambda req: not is_warmup(req)
        stream = tm.generate_request(
            GenerateReqInput(
                input_ids=[PROMPT, PROMPT[:20]],
                rid=["p", "q"],
                stream=True,
                sampling_params={"max_new_tokens": 3, "n": 2},
            )
        )
        first = asyncio.ensure_future(asyncio.wait_for(stream.__anext__(), WAIT_S))
        await until(lambda: len(fake.held) == 4)
        samples = list(fake.held)  # prompt-major: p-0, p-1, q-0, q-1
        seen = []
        for k in (3, 0, 2, 1):
            fake.release(lambda req, rid=samples[k].rid: req.rid == rid)
            out = await first if not seen else await asyncio.wait_for(stream.__anext__(), WAIT_S)
            seen.append((out["index"], out["meta_info"]["id"], len(out["output_ids"])))
        assert seen == [(3, "q-1", 3), (0, "p-0", 3), (2, "q-0", 3), (1, "p-1", 3)]
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(stream.__anext__(), WAIT_S)
        assert not tm.rid_to_state and not tm._reserved and not tm._children and not fake.aborted

    run_with_engine(test)


def test_one_samples_error_ends_the_stream_and_aborts_the_rest():
    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = lambda req: True
        stream = tm.generate_request(
            GenerateReqInput(
                input_ids=[PROMPT, PROMPT], rid=["a", "b"], stream=True, sampling_params={"max_new_tokens": 2}
            )
        )
        first = asyncio.ensure_future(asyncio.wait_for(stream.__anext__(), WAIT_S))
        await until(lambda: len(fake.held) == 2)
        fake.release(lambda req: req.rid == "a")
        assert (await first)["index"] == 0
        fake.fail(lambda req: req.rid == "b", "b: refused")
        with pytest.raises(RequestError, match="b: refused") as e:
            await asyncio.wait_for(stream.__anext__(), WAIT_S)
        assert e.value.status_code == 400
        assert not tm.rid_to_state and not tm._reserved and not fake.aborted  # both had ended

        fake.hold = lambda req: True
        stream = tm.generate_request(
            GenerateReqInput(
                input_ids=[PROMPT] * 3, rid=["x", "y", "z"], stream=True, sampling_params={"max_new_tokens": 2}
            )
        )
        first = asyncio.ensure_future(asyncio.wait_for(stream.__anext__(), WAIT_S))
        await until(lambda: len(fake.held) == 3)
        fake.fail(lambda req: req.rid == "y", "y: refused")
        with pytest.raises(RequestError, match="y: refused"):
            await first
        await until(lambda: sorted(fake.aborted) == ["x", "z"])  # the samples still running are not left running
        assert not tm.rid_to_state and not tm._reserved

    run_with_engine(test)


def test_leaving_a_batch_stream_aborts_its_unfinished_samples():
    """The caller closes the stream after the first output (an HTTP client gone): the samples not finished are
    aborted and every id is free again."""

    async def test(tm: TokenizerManager, fake: FakeScheduler) -> None:
        fake.hold = lambda req: not is_warmup(req)
        stream = tm.generate_request(
            GenerateReqInput(input_ids=PROMPT, rid="left", stream=True, sampling_params={"max_new_tokens": 4, "n": 3})
        )
        first = asyncio.ensure_future(asyncio.wait_for(stream.__anext__(), WAIT_S))
        await until(lambda: len(fake.held) == 3)
        samples = [req.rid for req in fake.held]
        fake.release(lambda req: req.rid == samples[1])
        out = await first
        assert out["index"] == 1 and out["meta_info"]["id"] == "left-1"
        await stream.aclose()
        await until(lambda: sorted(fake.aborted) == sorted([samples[0], samples[2]]))
        assert not tm.rid_to_state and not tm._reserved and not tm._children
        fake.hold = lambda req: False
        fake.release()  # their ends arrive after the abort and reach no state
        await until(lambda: not tm._aborting)
        again = await generate(tm, input_ids=PROMPT, rid="left", sampling_params={"max_new_tokens": 2, "n": 2})
        assert [o["meta_info"]["id"] for o in again] == ["left-0", "left-1"]

    run_with_engine(test)
