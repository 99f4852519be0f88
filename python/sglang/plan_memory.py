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
  SGLang's rule, as with SGLANG_POST_CAPTURE_MEASURE_ACTIVATION_PEAK=0.
Exact, as the server computes them: mem_fraction_static, the KV cell size, the reservations (the KT
full-GPU prefill slot), page and granule rounding, --max-total-tokens, the request-table size.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Union

from sglang.srt.environ import envs
from sglang.srt.model_executor.memory_plan import MemoryPlan
from sglang.srt.model_executor.pool_configurator import (
    GiB,
    MemoryReadings,
    MiB,
    NotEnoughMemoryError,
    PoolArgs,
    post_capture_pool_size,
    static_pool_size,
    virtual_pool,
)
from sglang.srt.server_args import AssumedDevice, ServerArgs, ServerArgsError

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


def model_facts(sa: ServerArgs, model_config) -> ModelFacts:
    import torch

    from sglang.srt.model_executor.model_runner import model_extra_kwargs
    from sglang.srt.models.registry import get_model_class

    cls = get_model_class(model_config.architecture)
    with _as_rank_zero(sa.tp_size), torch.device("meta"):
        model = cls(
            model_config.hf_config,
            model_config.dtype,
            max_position=model_config.context_len,
            **model_extra_kwargs(model_config, sa),
        )
        reservations = {name: int(n) for name, n in model.memory_reservations().items()}
    tensors = list(model.parameters()) + list(model.buffers())
    return ModelFacts(sum(t.numel() * t.element_size() for t in tensors), reservations)


def _captured_graph_max_bs(sa: ServerArgs, max_running_requests: int) -> int:
    """What CudaGraphRunner would capture up to (0 without graphs)."""
    if sa.disable_cuda_graph:
        return 0
    cap = min(sa.cuda_graph_max_bs, max_running_requests)
    return max((bs for bs in (sa.cuda_graph_bs or [cap]) if bs <= cap), default=0)


def plan_path(ns: argparse.Namespace, assumed: Assumptions, post_capture: bool) -> Union[MemoryPlan, str]:
    """One path's MemoryPlan, or the reason it cannot be planned."""
    from sglang.srt.configs.model_config import ModelConfig

    device = AssumedDevice(kind="cuda", memory_mib=assumed.gpu_memory_gib * 1024)
    with envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.override(post_capture):
        sa = ServerArgs.from_cli_args(ns, assume_device=device)
    path = sa.kv_sizing_path
    if path.post_capture != post_capture:
        return f"not planned: {path.reason}"
    model_config = ModelConfig.from_server_args(sa)
    args = PoolArgs.from_server_args(sa, model_config.context_len)
    facts = model_facts(sa, model_config)
    free_before = int((assumed.gpu_memory_gib - assumed.cuda_context_gib) * GiB)
    readings = MemoryReadings(
        device_capacity_bytes=int(assumed.gpu_memory_gib * GiB),
        free_before_weights_bytes=free_before,
        free_after_weights_bytes=free_before - facts.device_bytes,
        kv=model_config.largest_kv_geometry(sa.tp_size),
        page_size=sa.page_size,
        reservations_bytes=facts.reservations_bytes,
    )
    try:
        if post_capture:
            vp = virtual_pool(readings, args)
            graph_bs = _captured_graph_max_bs(sa, vp.max_running_requests)
            graphs = int(sa.reserve_for_graph_mb() * MiB) if graph_bs else 0
            readings = dataclasses.replace(
                readings,
                vmm_granularity_bytes=assumed.vmm_granularity_mib * MiB,
                graph_bytes=graphs,
                captured_graph_max_bs=graph_bs,
            )
            table = vp.max_running_requests * (model_config.context_len + 4) * 4  # int32 request table
            peak = None if assumed.activation_peak_gib is None else int(assumed.activation_peak_gib * GiB)
            readings = dataclasses.replace(
                readings,
                activation_peak_bytes=peak,
                free_after_capture_bytes=readings.free_after_weights_bytes
                - graphs
                - table
                - readings.backed_before_capture_bytes,
            )
            pool = post_capture_pool_size(readings, args)
        else:
            pool = static_pool_size(readings, args)
            graph_bs = _captured_graph_max_bs(sa, pool.max_running_requests)
            graphs = int(sa.reserve_for_graph_mb() * MiB) if graph_bs else 0
            readings = dataclasses.replace(readings, graph_bytes=graphs, captured_graph_max_bs=graph_bs)
    except NotEnoughMemoryError as e:
        return f"no KV cache fits: {e}"
    return MemoryPlan.report(
        readings,
        pool,
        path,
        args,
        device="cuda",
        tp_size=sa.tp_size,
        weights_bytes=facts.device_bytes,
        per_rank_free_after_weights_bytes=[readings.free_after_weights_bytes] * sa.tp_size,
        req_to_token_bytes=pool.max_running_requests * (model_config.context_len + 4) * 4,
        cuda_graph_max_bs=0 if sa.disable_cuda_graph else sa.cuda_graph_max_bs,
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
