"""CPU time the HTTP server process spends per streamed chunk (issue 15, item 3), on this machine.

    python benchmark/serving/profile_http_stream.py [--streams 64 256] [--tokens 64] [--out DIR]

The server (`python -m sglang.launch_server`, the built-in SmolLM2 on the CPU) runs N concurrent streaming
OpenAI completions (`openai.AsyncOpenAI`, `ignore_eos`, one token per chunk). The HTTP process (tokenizer manager,
OpenAI layer, SSE through Starlette and uvicorn) is the launcher process itself; its user + system CPU time
(/proc/PID/stat, children excluded) over the run, divided by the chunks the clients received, is the cost of one
streamed chunk there. At 256 streams on the H200 that cost times 256 must stay well below the decode step
(~15 ms), or the HTTP process, not the GPU, sets the inter-token latency. A diagnostic: the numbers belong to the
machine it ran on (compare before/after on one machine). Prints a table, writes results.json + results.md to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from typing import Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.test_utils import kill_process_tree, popen_launch_server  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` alone (its children are the scheduler and the detokenizer)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def stream_all(base_url: str, streams: int, tokens: int) -> int:
    """Run `streams` streaming completions at once; returns the chunks received."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=600)

    async def one(i: int) -> int:
        stream = await client.completions.create(
            model="default",
            prompt=f"Request {i}: tell me about the sea, the sky and the hills.",
            max_tokens=tokens,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        return sum([1 async for _ in stream])

    try:
        return sum(await asyncio.gather(*(one(i) for i in range(streams))))
    finally:
        await client.close()


def measure(base_url: str, pid: int, streams: int, tokens: int) -> dict:
    asyncio.run(stream_all(base_url, min(streams, 8), 4))  # warm-up: compile paths, open connections
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    chunks = asyncio.run(stream_all(base_url, streams, tokens))
    cpu1, t1 = cpu_seconds(pid), time.perf_counter()
    return {
        "streams": streams,
        "tokens_per_stream": tokens,
        "chunks": chunks,
        "wall_s": t1 - t0,
        "http_cpu_s": cpu1 - cpu0,
        "http_cpu_us_per_chunk": (cpu1 - cpu0) / max(chunks, 1) * 1e6,
        "http_cpu_share": (cpu1 - cpu0) / (t1 - t0),
    }


def markdown(data: dict) -> str:
    lines = [
        f"HTTP server process CPU per streamed chunk ({data['machine']}), SmolLM2 on the CPU, "
        "OpenAI completions with stream=True, one token per chunk.",
        "",
        "| streams | tokens each | chunks | wall s | HTTP process CPU s | CPU us per chunk | HTTP process busy |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['streams']} | {r['tokens_per_stream']} | {r['chunks']} | {r['wall_s']:.1f} | {r['http_cpu_s']:.2f} "
            f"| {r['http_cpu_us_per_chunk']:.0f} | {r['http_cpu_share']:.0%} |"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--out", default=None)
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="extra launch_server flags (last)")
    args = p.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="profile-http-")
    import torch

    data = {"machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}", "rows": []}
    cmd = ["--device", "cpu", "--max-total-tokens", "65536", "--max-running-requests", str(max(args.streams))]
    proc = popen_launch_server([*cmd, *args.server_args], timeout=600)
    try:
        for n in args.streams:
            data["rows"].append(measure(proc.base_url, proc.pid, n, args.tokens))
            write_results(out, data, markdown(data))
    finally:
        kill_process_tree(proc.pid)
        proc.wait(30)
    print(markdown(data))
    print("results in", out)


if __name__ == "__main__":
    main()
