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
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from sglang.srt.configs.engine_config import EngineConfig, resolve_engine_config
from sglang.srt.entrypoints.server_info import build_server_info
from sglang.srt.entrypoints.startup_watch import LaunchError, StartingChild, wait_until_ready
from sglang.srt.environ import envs
from sglang.srt.managers.detokenizer_manager import run_detokenizer_process
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.scheduler_process import run_scheduler_process
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.backend_decoder import remove_quietly, write_backend_json
from sglang.srt.utils.process import ChildEntry, PortArgs, configure_logger, kill_process_tree

logger = logging.getLogger(__name__)


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


def _start_child(ctx, target, args: tuple, name: str) -> StartingChild:
    reader, writer = ctx.Pipe(duplex=False)
    p = ctx.Process(target=ChildEntry.of(target), args=(*args, writer), name=name, daemon=True)
    with _children_ignore_sigint():
        p.start()
    # Only the child may hold the write end: then its death is end-of-file here, not silence.
    writer.close()
    return StartingChild(p, reader)


def _load_launcher_tokenizer(server_args: ServerArgs) -> Optional[Any]:
    """The tokenizer, or None (--skip-tokenizer-init, or it fails to load: then the detokenizer loads it and its
    failure names it, as when the launcher did not load it first)."""
    if server_args.skip_tokenizer_init:
        return None
    from sglang.srt.utils.hf_tokenizer import get_tokenizer

    try:
        return get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
    except Exception:  # noqa: BLE001 - reported by the detokenizer, which loads it again
        return None


def launch_subprocesses(config: EngineConfig) -> Tuple[Optional[TokenizerManager], dict, List[mp.Process]]:
    """Start the scheduler rank(s) of this node and the detokenizer, each with the resolved configuration;
    wait until every one is ready. Raises LaunchError (and leaves no child behind) when one fails, dies or
    times out."""
    server_args = config.args
    port_args = PortArgs.init_new(server_args.dist_init_addr)
    ctx = mp.get_context("spawn")  # CUDA cannot be used in forked children
    ranks_per_node = server_args.tp_size // server_args.nnodes
    first_rank = server_args.node_rank * ranks_per_node
    if server_args.device == "cpu":
        # Spawned children inherit this: idle OpenMP threads sleep instead of spinning, so ranks and the
        # other processes sharing the cores do not steal each other's time (a 10x slowdown otherwise).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    children: List[StartingChild] = []
    backend_json_path = None
    try:
        for local in range(ranks_per_node):
            rank = first_rank + local
            args = (config, port_args, server_args.base_gpu_id + local, rank)
            children.append(_start_child(ctx, run_scheduler_process, args, f"sglang-scheduler-{rank}"))
        tokenizer = None
        if server_args.node_rank == 0:
            # Loaded here while the scheduler starts (the TokenizerManager needs it anyway): the detokenizer then
            # decodes with its backend alone and imports neither torch nor transformers.
            tokenizer = _load_launcher_tokenizer(server_args)
            backend_json_path = write_backend_json(tokenizer) if tokenizer is not None else None
            args = (server_args, port_args, backend_json_path)
            children.append(_start_child(ctx, run_detokenizer_process, args, "sglang-detokenizer"))
        infos = wait_until_ready(children, envs.SGLANG_STARTUP_TIMEOUT.get())[:ranks_per_node]
    except BaseException:  # a failed, dead or timed-out child, or a signal: no child survives
        kill_process_tree([c.process for c in children], timeout=5)
        raise
    finally:
        remove_quietly(backend_json_path)  # read by the detokenizer before it reported ready
    procs = [c.process for c in children]
    # What each rank planned, for /server_info: the pool size must agree, the plan's readings may not.
    ranks = [
        {
            "tp_rank": first_rank + n,
            "max_total_num_tokens": i["max_total_num_tokens"],
            "path": i["memory_plan"]["path"],
            "reservations_bytes": i["memory_plan"]["reservations_bytes"],
        }
        for n, i in enumerate(infos)
    ]
    info = dict(infos[0], ranks=ranks)
    if len({i["max_total_num_tokens"] for i in infos}) != 1:
        kill_process_tree(procs)
        raise LaunchError(f"ranks disagree on max_total_num_tokens: {[i['max_total_num_tokens'] for i in infos]}")
    if server_args.node_rank != 0:
        return None, info, procs
    tm = TokenizerManager(server_args, port_args, info, tokenizer=tokenizer)
    tm.child_processes = procs
    return tm, info, procs


class Engine:
    def __init__(self, server_args: Optional[ServerArgs] = None, **kwargs: Any) -> None:
        """`server_args`, or its fields as keyword arguments (SGLang's Engine(**kwargs)); a bad value raises
        ServerArgsError naming the flag before any process starts."""
        self.config = resolve_engine_config(server_args or ServerArgs(**kwargs))
        self.server_args = self.config.args  # resolved
        configure_logger(self.server_args.log_level)
        self.tokenizer_manager, self.scheduler_info, self.processes = launch_subprocesses(self.config)
        self.loop = asyncio.new_event_loop()
        self.startup_time = time.time()
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
        logprob_start_len: Union[int, List[int]] = -1,
        top_logprobs_num: Union[int, List[int]] = 0,
        token_ids_logprob: Optional[Union[List[int], List[List[int]]]] = None,
        return_text_in_logprobs: bool = False,
    ) -> Union[Dict, List[Dict], Iterator[Dict]]:
        """SGLang's Engine.generate: the /generate fields (logprobs in meta_info, as there)."""
        obj = GenerateReqInput(
            text=prompt,
            input_ids=input_ids,
            sampling_params=sampling_params,
            rid=rid,
            return_logprob=return_logprob,
            stream=stream,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            token_ids_logprob=token_ids_logprob,
            return_text_in_logprobs=return_text_in_logprobs,
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
        obj = GenerateReqInput(
            text=prompt, input_ids=input_ids, sampling_params=sampling_params, return_logprob=return_logprob
        )
        async for out in self.tokenizer_manager.generate_request(obj):
            return out

    def flush_cache(self) -> bool:
        return self.loop.run_until_complete(self.tokenizer_manager.flush_cache()).success

    def get_server_info(self) -> Dict:
        """What /server_info returns (the scheduler's latest periodic stats included)."""
        self.loop.run_until_complete(self._receive_stats())
        return build_server_info(self.server_args, self.tokenizer_manager, self.startup_time)

    async def _receive_stats(self) -> None:
        self.tokenizer_manager.start()
        await asyncio.sleep(0.6)  # the scheduler reports every 0.5 s

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
