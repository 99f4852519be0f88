"""Plan a server's device memory from the model's config alone, on any machine (no GPU needed).

    python -m sglang.plan_memory --model-path DIR [--tp-size N] [--gpu-memory-gib 141] [server flags]

Prints the memory plan of both KV sizing paths, static and post-capture, for the GPU described: the
same pure planner the server runs (srt/model_executor/pool_configurator.py) fed with estimates where
the server measures. Estimated, not measured:
- free memory before the weights: the device's capacity less the CUDA context (--cuda-context-gib);
- the weights: parameter and buffer bytes of the model built on the meta device (rank 0's share);
- CUDA-graph memory: SGLang's guess, reserve_for_graph_mb() (cuda_graph_max_bs * 2 MiB);
- free memory after capture: free after the weights, less the graphs, the request table and the first
  VMM granule (--vmm-granularity-mib) of every KV buffer;
- the activation peak: not estimated; without --activation-peak-gib the post-capture headroom follows
  SGLang's rule (what the server keeps when it has no measurement).
Exact, as the server computes them (the same code: the resolve step, the planner, the graph runner's
capture sizes, the request table's size): mem_fraction_static, the KV cell size, the reservations (the KT
prefill slot), page and granule rounding, --max-total-tokens, the request-table size.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Union

from sglang.srt.configs.device_config import described_device
from sglang.srt.configs.engine_config import EngineConfig, resolve_engine_config
from sglang.srt.mem_cache.memory_pool import req_to_token_bytes
from sglang.srt.model_executor.memory_plan import MemoryPlan
from sglang.srt.model_executor.pool_configurator import (
    CaptureReadings,
    GiB,
    MemoryReadings,
    MiB,
    NotEnoughMemoryError,
    post_capture_pool_size,
    static_pool_size,
    virtual_pool,
)
from sglang.srt.server_args import ServerArgs, ServerArgsError

# Free memory before the weights on the H200 was 139.29 GiB of its 140.40 GiB (benchmark/kv_sizing, TP=1).
DEFAULT_CUDA_CONTEXT_GIB = 1.1
DEFAULT_VMM_GRANULARITY_MIB = 2  # CU_MEM_ALLOC_GRANULARITY_MINIMUM on the H100/H200


@dataclasses.dataclass(frozen=True)
class Assumptions:
    gpu_memory_gib: float
    cuda_context_gib: float
    vmm_granularity_mib: int
    activation_peak_gib: Optional[float]


def parse_args(argv: List[str]) -> tuple[argparse.Namespace, Assumptions]:
    parser = argparse.ArgumentParser(prog="python -m sglang.plan_memory", description=__doc__.splitlines()[0])
    ServerArgs.add_cli_args(parser)
    parser.set_defaults(load_format="dummy")  # only config.json is read: no weights are needed
    g = parser.add_argument_group("the GPU to plan for (estimates)")
    g.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=140.4,
        help="Total memory of one GPU, GiB (an H200 reports 143771 MiB = 140.4 GiB).",
    )
    g.add_argument(
        "--cuda-context-gib",
        type=float,
        default=DEFAULT_CUDA_CONTEXT_GIB,
        help="What the CUDA context takes before the weights load, GiB.",
    )
    g.add_argument("--vmm-granularity-mib", type=int, default=DEFAULT_VMM_GRANULARITY_MIB)
    g.add_argument(
        "--activation-peak-gib",
        type=float,
        default=None,
        help="A measured activation peak (the post-capture log shows it) to plan the headroom with.",
    )
    ns = parser.parse_args(argv)
    return ns, Assumptions(ns.gpu_memory_gib, ns.cuda_context_gib, ns.vmm_granularity_mib, ns.activation_peak_gib)


@contextmanager
def _as_rank_zero(tp_size: int) -> Iterator[None]:
    """Build layers as tensor-parallel rank 0 of tp_size would (construction only asks rank and size)."""
    from sglang.srt.distributed import parallel_state

    saved = parallel_state._TP
    parallel_state._TP = parallel_state.GroupCoordinator(rank_in_group=0, world_size=tp_size)
    try:
        yield
    finally:
        parallel_state._TP = saved


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What a meta-device build of the model tells about rank 0 (nothing is allocated)."""

    device_bytes: int  # parameters and buffers on the GPU (CPU-resident KT experts excluded)
    reservations_bytes: Dict[str, int]


def model_facts(config: EngineConfig) -> ModelFacts:
    import torch

    from sglang.srt.layers.moe.kt_prefill_slot import RESERVATION_NAME
    from sglang.srt.model_loader.loader import build_model

    with _as_rank_zero(config.args.tp_size), torch.device("meta"):
        model = build_model(config.model, config.kt)
        slot = model.kt_prefill_slot()
        reservations = {} if slot is None else {RESERVATION_NAME: slot.nbytes}
    tensors = list(model.parameters()) + list(model.buffers())
    return ModelFacts(sum(t.numel() * t.element_size() for t in tensors), reservations)


def plan_path(ns: argparse.Namespace, assumed: Assumptions, post_capture: bool) -> Union[MemoryPlan, str]:
    """One path's MemoryPlan, or the reason it cannot be planned."""
    device = described_device("cuda", assumed.gpu_memory_gib * 1024)
    config = resolve_engine_config(ServerArgs.from_cli_args(ns), device=device, post_capture=post_capture)
    path, args, kernels = config.memory.path, config.memory.pool, config.kernels
    if path.post_capture != post_capture:
        return f"not planned: {path.reason}"
    facts = model_facts(config)
    free_before = int((assumed.gpu_memory_gib - assumed.cuda_context_gib) * GiB)
    readings = MemoryReadings(
        device_capacity_bytes=int(assumed.gpu_memory_gib * GiB),
        free_before_weights_bytes=free_before,
        free_after_weights_bytes=free_before - facts.device_bytes,
        kv=config.model.largest_kv_geometry(config.args.tp_size, config.memory.swa_full_tokens_ratio),
        page_size=config.args.page_size,
        reservations_bytes=facts.reservations_bytes,
        vmm_granularity_bytes=assumed.vmm_granularity_mib * MiB if post_capture else None,
    )

    def graphs_for(request_rows: int) -> tuple[int, int]:
        """(largest captured batch, estimated graph bytes) for a request table of `request_rows` rows."""
        sizes = kernels.capture_batch_sizes(request_rows)
        return (sizes[-1], config.memory.graph_reserve_bytes) if sizes else (0, 0)

    try:
        if post_capture:
            rows = virtual_pool(readings, args).max_running_requests
            graph_bs, graphs = graphs_for(rows)
            table = req_to_token_bytes(rows, config.model.context_len)
            peak = None if assumed.activation_peak_gib is None else int(assumed.activation_peak_gib * GiB)
            capture = CaptureReadings(
                graph_bytes=graphs,
                captured_graph_max_bs=graph_bs,
                activation_peak_bytes=peak,
                free_after_capture_bytes=readings.free_after_weights_bytes
                - graphs
                - table
                - readings.backed_before_capture_bytes,
            )
            pool = post_capture_pool_size(readings, capture, args)
        else:
            pool = static_pool_size(readings, args)
            graph_bs, graphs = graphs_for(pool.max_running_requests)
            capture = CaptureReadings(graph_bytes=graphs, captured_graph_max_bs=graph_bs)
    except NotEnoughMemoryError as e:
        return f"no KV cache fits: {e}"
    return MemoryPlan.report(
        readings,
        capture,
        pool,
        path,
        args,
        device="cuda",
        tp_size=config.args.tp_size,
        weights_bytes=facts.device_bytes,
        per_rank_free_after_weights_bytes=[readings.free_after_weights_bytes] * config.args.tp_size,
        req_to_token_bytes=req_to_token_bytes(pool.max_running_requests, config.model.context_len),
        cuda_graph_max_bs=kernels.cuda_graph_max_bs if kernels.cuda_graphs else 0,
        free_after_start_up_bytes=0,
        notes=list(pool.warnings),
    )


def main(argv: Optional[List[str]] = None) -> int:
    ns, assumed = parse_args(sys.argv[1:] if argv is None else argv)
    print(
        f"Planning for one GPU of {assumed.gpu_memory_gib:g} GiB per rank (CUDA context "
        f"{assumed.cuda_context_gib:g} GiB); terms marked 'estimated' are measured by a real start."
    )
    for post_capture in (False, True):
        name = "post-capture" if post_capture else "static"
        try:
            plan = plan_path(ns, assumed, post_capture)
        except ServerArgsError as e:
            print(f"\n[{name}] {e}")
            return 2
        if isinstance(plan, str):
            print(f"\n[{name}] {plan}")
        else:
            print(f"\n[{name}]\n{plan.format_table(measured=False)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
