"""Engine: the offline API, and the process launcher shared with the HTTP server.

    engine = sglang.Engine(model_path=..., **server_args)
    engine.generate("Hello", {"max_new_tokens": 16, "temperature": 0})
    engine.shutdown()

Same pipeline as the server (scheduler and detokenizer processes, TokenizerManager here), no HTTP.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from sglang.srt.managers.detokenizer_manager import run_detokenizer_process
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.scheduler_process import run_scheduler_process
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.process import PortArgs, configure_logger, kill_process_tree

logger = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    pass


@contextlib.contextmanager
def _children_ignore_sigint():
    """Start children with SIGINT ignored (an ignored disposition survives exec, and Python then
    installs no KeyboardInterrupt handler). Ctrl-C in a terminal signals the whole process group;
    this way only the launcher reacts and shuts its children down in order, instead of every child
    printing a KeyboardInterrupt traceback and the scheduler reporting a crash."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def launch_subprocesses(server_args: ServerArgs) -> Tuple[Optional[TokenizerManager], dict, List[mp.Process]]:
    """Start the scheduler rank(s) of this node and the detokenizer; wait until every rank is ready."""
    port_args = PortArgs.init_new(server_args.dist_init_addr)
    ctx = mp.get_context("spawn")  # CUDA cannot be used in forked children
    procs: List[mp.Process] = []
    pipes = []
    ranks_per_node = server_args.tp_size // server_args.nnodes
    first_rank = server_args.node_rank * ranks_per_node
    if server_args.device == "cpu":
        # Spawned children inherit this: idle OpenMP threads sleep instead of spinning, so ranks and the
        # other processes sharing the cores do not steal each other's time (a 10x slowdown otherwise).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for local in range(ranks_per_node):
        reader, writer = ctx.Pipe(duplex=False)
        gpu_id = server_args.base_gpu_id + local
        p = ctx.Process(
            target=run_scheduler_process,
            args=(server_args, port_args, gpu_id, first_rank + local, writer),
            name=f"sglang-scheduler-{first_rank + local}",
            daemon=True,
        )
        with _children_ignore_sigint():
            p.start()
        procs.append(p)
        pipes.append(reader)
    if server_args.node_rank == 0:
        p = ctx.Process(target=run_detokenizer_process, args=(server_args, port_args), name="sglang-detokenizer", daemon=True)
        with _children_ignore_sigint():
            p.start()
        procs.append(p)
    infos = []
    for reader, p in zip(pipes, procs):
        try:
            info = reader.recv()
        except EOFError:
            info = {"status": "error", "message": f"{p.name} exited with code {p.exitcode} before it was ready"}
        if info.get("status") != "ready":
            kill_process_tree(procs)
            raise LaunchError(f"scheduler failed to start:\n{info.get('message', info)}")
        infos.append(info)
    # What each rank planned, for /server_info: the pool size must agree, the plan's readings may not.
    ranks = [
        {"tp_rank": first_rank + n, "max_total_num_tokens": i["max_total_num_tokens"], "path": i["memory_plan"]["path"],
         "reservations_bytes": i["memory_plan"]["reservations_bytes"]}
        for n, i in enumerate(infos)
    ]
    info = dict(infos[0], ranks=ranks)
    if len({i["max_total_num_tokens"] for i in infos}) != 1:
        kill_process_tree(procs)
        raise LaunchError(f"ranks disagree on max_total_num_tokens: {[i['max_total_num_tokens'] for i in infos]}")
    if server_args.node_rank != 0:
        return None, info, procs
    tm = TokenizerManager(server_args, port_args, info)
    tm.child_processes = procs
    return tm, info, procs


class Engine:
    def __init__(self, server_args: Optional[ServerArgs] = None, **kwargs: Any) -> None:
        self.server_args = server_args or ServerArgs(**kwargs)
        configure_logger(self.server_args.log_level)
        self.tokenizer_manager, self.scheduler_info, self.processes = launch_subprocesses(self.server_args)
        self.loop = asyncio.new_event_loop()
        atexit.register(self.shutdown)

    # ---------------------------------------------------------- generation
    def generate(
        self,
        prompt: Optional[Union[str, List[str]]] = None,
        sampling_params: Optional[Union[Dict, List[Dict]]] = None,
        input_ids: Optional[Union[List[int], List[List[int]]]] = None,
        return_logprob: Union[bool, List[bool]] = False,
        stream: bool = False,
        rid: Optional[Union[str, List[str]]] = None,
    ) -> Union[Dict, List[Dict], Iterator[Dict]]:
        obj = GenerateReqInput(
            text=prompt, input_ids=input_ids, sampling_params=sampling_params, rid=rid,
            return_logprob=return_logprob, stream=stream,
        )
        agen = self.tokenizer_manager.generate_request(obj)
        if stream:
            return self._iterate(agen)
        return self.loop.run_until_complete(agen.__anext__())

    def _iterate(self, agen) -> Iterator[Dict]:
        while True:
            try:
                yield self.loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False) -> Dict:
        obj = GenerateReqInput(text=prompt, input_ids=input_ids, sampling_params=sampling_params, return_logprob=return_logprob)
        async for out in self.tokenizer_manager.generate_request(obj):
            return out

    def flush_cache(self) -> bool:
        return self.loop.run_until_complete(self.tokenizer_manager.flush_cache()).success

    def get_server_info(self) -> Dict:
        self.loop.run_until_complete(asyncio.sleep(0.6))  # let the scheduler's periodic stats arrive
        return {
            **self.server_args.to_public_dict(),
            **{k: v for k, v in self.scheduler_info.items() if k != "status"},
            "scheduler_stats": vars(self.tokenizer_manager.stats),
        }

    def shutdown(self) -> None:
        if not self.loop.is_closed():
            self.loop.run_until_complete(self.tokenizer_manager.stop())
            self.loop.close()
        if self.processes:
            kill_process_tree(self.processes)
            self.processes = []

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
