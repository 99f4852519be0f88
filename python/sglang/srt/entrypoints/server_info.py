"""/server_info (alias /get_server_info) and /model_info (alias /get_model_info), in upstream SGLang's shape.

Upstream clients read the resolved server args at the top level, `internal_states` (one dict per
data-parallel rank; bench_serving reads `internal_states[0]["avg_spec_accept_length"]`), `version`
and `startup_time`. Ours adds what the engine planned: `max_total_num_tokens`, `memory_plan` (also in
each internal state), `ranks` and `scheduler_stats`. The Engine's get_server_info() returns the same.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Dict, List

from sglang import __version__

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import ServerArgs

GiB = 1 << 30


def internal_state(tm: "TokenizerManager") -> Dict[str, Any]:
    """What upstream's scheduler reports about itself (our one data-parallel rank)."""
    info, stats = tm.scheduler_info, tm.stats
    plan = info.get("memory_plan", {})
    return {
        "memory_usage": {
            "weight": round(plan.get("weights_gb", 0.0), 2),
            "kvcache": round(plan.get("kv_pool_gb", 0.0), 2),
            "graph": round(plan.get("cuda_graph_gb", 0.0), 2),
            "token_capacity": info["max_total_num_tokens"],
        },
        "last_gen_throughput": stats.gen_throughput,
        "avg_spec_accept_length": None,  # no speculative decoding
        "effective_max_running_requests_per_dp": info.get("max_running_requests"),
        "num_running_reqs": stats.num_running_reqs,
        "num_queue_reqs": stats.num_queued_reqs,
        "token_usage": stats.token_usage,
        "memory_plan": plan,
    }


def build_server_info(server_args: "ServerArgs", tm: "TokenizerManager", startup_time: float) -> Dict[str, Any]:
    scheduler_info = {k: v for k, v in tm.scheduler_info.items() if k != "status"}
    if tm.stats.kt_slot is not None:  # the elastic slot's live state (lent now? how often taken and given back)
        scheduler_info["memory_plan"] = {**scheduler_info["memory_plan"], "kt_slot": tm.stats.kt_slot}
    return {
        **server_args.to_public_dict(),
        **scheduler_info,
        "internal_states": [internal_state(tm)],
        "scheduler_stats": dataclasses.asdict(tm.stats),
        "child_processes": [{"name": p.name, "pid": p.pid} for p in tm.child_processes],
        "version": __version__,
        "startup_time": startup_time,
        # What SGLang's router reads of a worker (one data-parallel rank, no prefill/decode split).
        "dp_size": 1,
        "load_balance_method": "round_robin",
        "disaggregation_mode": "null",
    }


def build_load(tm: "TokenizerManager") -> List[Dict[str, Any]]:
    """/get_load in upstream's shape, one entry per data-parallel rank: requests in flight, those the
    scheduler still queues, and the tokens they hold or will hold (prompt + generated so far). Counted
    from this process's own requests, so the router's poll always sees the load of this moment."""
    states = [s for s in tm.rid_to_state.values() if s.req is not None]
    num_reqs = len(states)
    return [
        {
            "dp_rank": 0,
            "num_reqs": num_reqs,
            "num_waiting_reqs": min(tm.stats.num_queued_reqs, num_reqs),
            "num_tokens": sum(len(s.req.input_ids) + len(s.output_ids) for s in states),
            "ts_tic": time.perf_counter(),
        }
    ]


def build_model_info(server_args: "ServerArgs", tm: "TokenizerManager") -> Dict[str, Any]:
    info = tm.scheduler_info
    return {
        "model_path": server_args.model_path,
        "tokenizer_path": server_args.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": info.get("model_type"),
        "architectures": info.get("architectures"),
        "served_model_name": server_args.served_model_name,
        "max_context_length": tm.context_len,
    }
