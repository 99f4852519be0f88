"""What the benchmark scripts under benchmark/ share: writing their results, timing a CUDA graph."""

from __future__ import annotations

import json
import os
from typing import Any, Callable


def write_results(out_dir: str, data: Any, markdown: str, name: str = "results") -> None:
    """<name>.json (the measured data) and <name>.md (the table the script printed) in out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(markdown.rstrip("\n") + "\n")


def cuda_graph_ms(step: Callable[[], None], replays: int = 20) -> float:
    """Milliseconds per replay of `step` captured as one CUDA graph (after an eager warm-up call),
    launch gaps included: how the engine runs its decode step."""
    import torch

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays
