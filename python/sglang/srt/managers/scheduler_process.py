"""The scheduler process: receives tokenized requests, runs the Scheduler, sends tokens onward.

Rank 0 talks ZeroMQ and broadcasts every received message to the other tensor-parallel ranks, so
all ranks take the same scheduling decisions. A crash is reported, never swallowed: before the
ready signal through the start-up pipe, afterwards as a SchedulerFailed message to the tokenizer
manager; either way the process exits non-zero.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
import traceback
from typing import List, Optional

import torch
import zmq

from sglang.srt.configs.engine_config import EngineConfig
from sglang.srt.distributed import get_tp_group
from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import (
    AbortReq,
    FlushCacheReq,
    FlushCacheReqOutput,
    SchedulerFailed,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.scheduler import build_scheduler
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
STATS_INTERVAL_S = 0.5


def broadcast_pyobj(objs: List, src_is_me: bool) -> List:
    """Send a picklable list from rank 0 to every rank over the CPU group."""
    group = get_tp_group()
    if group.world_size == 1:
        return objs
    import torch.distributed as dist

    if src_is_me:
        data = pickle.dumps(objs)
        size = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(size, src=0, group=group.cpu_group)
        if len(data):
            dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0, group=group.cpu_group)
        return objs
    size = torch.tensor([0], dtype=torch.int64)
    dist.broadcast(size, src=0, group=group.cpu_group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buf, src=0, group=group.cpu_group)
    return pickle.loads(buf.numpy().tobytes())


class SchedulerProcess:
    def __init__(self, config: EngineConfig, port_args: PortArgs, gpu_id: int, tp_rank: int, faults: FaultPlan) -> None:
        self.tp_rank = tp_rank
        self.is_entry_rank = tp_rank == 0
        ctx = zmq.Context(2)
        if self.is_entry_rank:
            self.recv_from_tokenizer = ctx.socket(zmq.PULL)
            self.recv_from_tokenizer.bind(port_args.scheduler_input_ipc_name)
            self.send_to_detokenizer = ctx.socket(zmq.PUSH)
            self.send_to_detokenizer.connect(port_args.detokenizer_ipc_name)
            self.send_to_tokenizer = ctx.socket(zmq.PUSH)
            self.send_to_tokenizer.connect(port_args.tokenizer_ipc_name)
        self.scheduler = build_scheduler(
            config,
            gpu_id,
            tp_rank,
            port_args.dist_init_method,
            output_sink=self._send_tokens,
            faults=faults,
            host_slot_tail_tokens=envs.SGLANG_TEST_CPU_ELASTIC_SLOT_TAIL_TOKENS.get(),
        )
        self._last_stats = 0.0

    def _send_tokens(self, out) -> None:
        if self.is_entry_rank:
            self.send_to_detokenizer.send_pyobj(out)

    def ready_info(self) -> dict:
        mr = self.scheduler.model_runner
        return {
            "status": STARTUP_READY,
            "max_total_num_tokens": self.scheduler.max_total_num_tokens,
            "max_running_requests": self.scheduler.max_running_requests,
            "context_len": self.scheduler.model_config.context_len,
            "vocab_size": self.scheduler.model_config.vocab_size,
            "model_type": self.scheduler.model_config.hf_config.model_type,
            "architectures": list(self.scheduler.model_config.hf_config.architectures or []),
            "memory_plan": mr.memory_plan.to_dict(),
        }

    def recv_requests(self, block: bool) -> List:
        msgs: List = []
        if self.is_entry_rank:
            if block and not self.recv_from_tokenizer.poll(timeout=STATS_INTERVAL_S * 1000):
                pass
            while True:
                try:
                    msgs.append(self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK))
                except zmq.ZMQError:
                    break
        return broadcast_pyobj(msgs, self.is_entry_rank)

    def dispatch(self, msg) -> None:
        sched = self.scheduler
        if isinstance(msg, TokenizedGenerateReqInput):
            sched.add_request(msg)
        elif isinstance(msg, AbortReq):
            sched.abort_request(msg)
        elif isinstance(msg, FlushCacheReq):
            ok = sched.flush_cache()
            if self.is_entry_rank:
                note = "" if ok else "requests are in flight; the cache was not flushed"
                self.send_to_tokenizer.send_pyobj(FlushCacheReqOutput(ok, note))
        else:
            logger.error("Scheduler got an unknown message %r", type(msg).__name__)

    def _send_stats(self) -> None:
        now = time.monotonic()
        if self.is_entry_rank and now - self._last_stats >= STATS_INTERVAL_S:
            self.scheduler.update_stats()
            self.send_to_tokenizer.send_pyobj(self.scheduler.stats)
            self._last_stats = now

    def event_loop(self) -> None:
        sched = self.scheduler
        while True:
            for msg in self.recv_requests(block=not sched.has_work()):
                self.dispatch(msg)
            sched.step()
            self._send_stats()

    def report_failure(self, message: str) -> None:
        if self.is_entry_rank:
            self.send_to_tokenizer.send_pyobj(SchedulerFailed(message))
            time.sleep(0.2)  # let ZeroMQ flush before the process exits


def cpu_intra_op_threads(cpu_count: int, ranks_here: int, omp_num_threads: Optional[str]) -> Optional[int]:
    """Intra-op threads for each CPU scheduler rank, or None to keep torch's own count (the user's OMP_NUM_THREADS).

    The ranks of one node share its cores but one: the launcher's HTTP and tokenizer process and the detokenizer
    work at every decode step too, and an OpenMP thread they push off its core stalls the others at the next
    barrier. On the 2-core test machine (`benchmark/cpu_throughput/results_history_2026-12-04.json`, SmolLM2) one
    thread served 18.8 tokens/s single stream and 99.1 with 16 requests, torch's default two threads 14.7 and 92.7."""
    if omp_num_threads:
        return None
    return max(1, (cpu_count - 1) // ranks_here)


def run_scheduler_process(config: EngineConfig, port_args: PortArgs, gpu_id: int, tp_rank: int, pipe) -> None:
    die_with_parent()
    raise_on_sigterm()
    args = config.args
    if args.device == "cpu":
        threads = cpu_intra_op_threads(
            os.cpu_count() or 1, args.tp_size // args.nnodes, os.environ.get("OMP_NUM_THREADS")
        )
        if threads is not None:
            torch.set_num_threads(threads)
    configure_logger(args.log_level, prefix=f"TP{tp_rank}" if args.tp_size > 1 else "")
    with reporting_startup(pipe, "Scheduler"):
        faults = FaultPlan.from_env()
        proc = SchedulerProcess(config, port_args, gpu_id, tp_rank, faults)
        faults.at_startup("scheduler")
        pipe.send(proc.ready_info())
    try:
        proc.event_loop()
    except ShutdownRequested as e:
        logger.info("Scheduler rank %d stopping (%s)", tp_rank, e)
        proc.scheduler.model_runner.shutdown()  # graphs, pools, then the VMM ranges, in that order
        raise SystemExit(0) from None
    except BaseException:
        msg = traceback.format_exc()
        logger.error("Scheduler hit an exception:\n%s", msg)
        proc.report_failure(msg)
        raise SystemExit(1) from None
