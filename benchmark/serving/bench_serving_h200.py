"""Upstream SGLang's own serving benchmark (`bench_serving.py` of sglang==0.4.6.post5, unchanged) against our
server: Llama-3.1-8B shape, dummy weights, a real tokenizer, static vs post-capture KV sizing.

    python benchmark/serving/bench_serving_h200.py --prepare         # here (network): wheel, tokenizer -> .device/upstream
    python3 benchmark/serving/bench_serving_h200.py --out-dir $OUT   # the GPU machine (no network; carry .device)
    python benchmark/serving/bench_serving_h200.py --dry-run         # this CPU machine: tiny model, tiny counts

Native FP8 checkpoints (block fp8: e4m3 weights, ``weight_scale_inv`` per 128x128 block, the layout of DeepSeek-V3
and Qwen3-*-FP8): a variant whose flags hold ``--checkpoint-fp8`` (taken here, not passed to the server) serves the
shape's config with that quantization_config, dummy weights drawn in the checkpoint's format (no disk write):

    python3 benchmark/serving/bench_serving_h200.py --paths post-capture --backend sglang-oai --concurrency 256 \
      --num-prompts 512 --variants "fp8=--quantization fp8" "native-fp8=--checkpoint-fp8"

and ``--write-fp8-checkpoint`` writes the shape as a real checkpoint first (random e4m3 codes and block scales,
safetensors shards and index, sglang.test.fp8_checkpoints.write_random_block_fp8_checkpoint; Qwen3-8B: ~8 GB, drawn
on the GPU) and serves it with a real load (no --load-format dummy):

    python3 benchmark/serving/bench_serving_h200.py --shape Qwen3-8B --write-fp8-checkpoint --paths post-capture \
      --backend sglang-oai --concurrency 64 256 --num-prompts 128 512

For each path (static: SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=0; post-capture: =1) it starts
`python -m sglang.launch_server --model-path DIR --load-format dummy`, where DIR holds the Llama-3.1-8B
config (vocab_size 49152, SmolLM2's) and SmolLM2's tokenizer, runs one unrecorded warm-up benchmark, then
`bench_serving.py --backend sglang --dataset-name random --random-range-ratio 1` at each concurrency
(1024 in / 256 out, ignore_eos, the cache flushed after bench_serving's own warm-up request). The random
dataset cuts ShareGPT-format conversations to the input length; they are written from this repository's
markdown (no download), each starting at a different word so that no two prompts share a cached prefix.

bench_serving runs as a script from the unpacked wheel, with PYTHONPATH cleared so that this checkout's
`sglang` is not importable in it (it imports aiohttp, numpy, requests, tqdm and transformers, all on the
GPU machine). Each row sits next to the decode step time of benchmark/decode_roofline/ (CUDA-graph replay
at the same batch size, context 1024). Results are written after every run (results.json + results.md via
sglang.test.bench_utils.write_results), so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.test_utils import kill_process_tree, popen_launch_server, read_log  # noqa: E402
from sglang.test.upstream_clients import (  # noqa: E402
    UPSTREAM_VERSION,
    client_env,
    fetch_wheel,
    last_json_line,
    save_portable_tokenizer,
    unpack_wheel,
)

HERE = os.path.dirname(os.path.abspath(__file__))
STAGE = os.path.join(ROOT, ".device", "upstream")  # git-ignored; what a device run carries
TOKENIZER_DIR = os.path.join(STAGE, "smollm2-tokenizer")
ROOFLINE = os.path.join(ROOT, "benchmark", "decode_roofline", "results.json")
PATHS = {"static": "0", "post-capture": "1"}
SMOLLM2_VOCAB, SMOLLM2_BOS, SMOLLM2_EOS = 49152, 1, 2  # <|im_start|>, <|im_end|>


def _load_script(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prepare() -> None:
    """Needs the network and the project env (the built-in SmolLM2 wheel): run here, before the device run."""
    from sglang.srt.utils.hf_tokenizer import get_tokenizer

    print("wheel:", fetch_wheel(STAGE))
    shutil.rmtree(TOKENIZER_DIR, ignore_errors=True)
    print("tokenizer:", save_portable_tokenizer(get_tokenizer("SmolLM2-135M-Instruct"), TOKENIZER_DIR))


def shape_config(shape: str) -> dict:
    """The shape's config.json with SmolLM2's vocabulary (its tokenizer's)."""
    if shape.startswith("tiny-"):  # the CPU dry run: tiny-llama, tiny-qwen3
        from sglang.test.runners import TINY_CONFIGS

        arch = shape[len("tiny-") :]
        cfg = dict(TINY_CONFIGS[arch], model_type=arch, torch_dtype="float32", max_position_embeddings=4096)
    else:
        shapes = _load_script(os.path.join(ROOT, "scripts", "make_model_configs.py"), "make_model_configs").SHAPES
        cfg = dict(shapes[shape])
    cfg.update(vocab_size=SMOLLM2_VOCAB, bos_token_id=SMOLLM2_BOS, eos_token_id=SMOLLM2_EOS)
    return cfg


def model_dir(work: str, shape: str, checkpoint_fp8: bool = False) -> str:
    """A dummy-weight model directory: the shape's config with SmolLM2's vocabulary, plus its tokenizer; with
    `checkpoint_fp8` the config declares a native block-fp8 checkpoint (dummy weights are drawn in its format)."""
    from sglang.test.fp8_checkpoints import quantization_config

    cfg = shape_config(shape)
    if checkpoint_fp8:
        cfg["quantization_config"] = quantization_config("block")
    d = os.path.join(work, f"{shape}-vocab{SMOLLM2_VOCAB}{'-block-fp8' if checkpoint_fp8 else ''}")
    shutil.copytree(TOKENIZER_DIR, d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return d


def written_fp8_checkpoint(work: str, shape: str) -> tuple[str, dict]:
    """The shape written to disk as a native block-fp8 checkpoint (random weights, drawn on the GPU where there is
    one), with SmolLM2's tokenizer: its directory and what writing it took."""
    import torch

    from sglang.srt.model_loader.weight_utils import checkpoint_files
    from sglang.test.fp8_checkpoints import write_random_block_fp8_checkpoint

    d = os.path.join(work, f"{shape}-vocab{SMOLLM2_VOCAB}-block-fp8-written")
    shutil.copytree(TOKENIZER_DIR, d)
    t = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # In a process of its own: its CUDA context and cached blocks leave with it, the servers get the whole GPU.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(write_random_block_fp8_checkpoint, shape_config(shape), d, device=device).result()
    files = checkpoint_files(d)
    facts = {
        "checkpoint_write_s": round(time.monotonic() - t, 1),
        "checkpoint_bytes": sum(os.path.getsize(f) for f in files),
        "checkpoint_shards": len(files),
    }
    print(f"wrote {d}: {facts}", flush=True)
    return d, facts


def write_corpus(path: str, rows: int, words_per_row: int) -> str:
    """ShareGPT-format conversations from the repository's markdown, each starting at its own word."""
    words: List[str] = []
    for md in sorted(glob.glob(os.path.join(ROOT, "**", "*.md"), recursive=True)):
        if "/.device/" not in md:
            with open(md, errors="replace") as f:
                words += f.read().split()
    if len(words) < rows:
        raise RuntimeError(f"only {len(words)} words of markdown for {rows} distinct prompts")
    stride = len(words) // rows
    convs = []
    for k in range(rows):
        start = k * stride
        text = " ".join(words[(start + i) % len(words)] for i in range(words_per_row))
        convs.append({"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "-"}]})
    with open(path, "w") as f:
        json.dump(convs, f)
    return path


def roofline_steps(path: str = ROOFLINE) -> Dict[int, float]:
    """Decode step ms by batch size at context 1024, from a bench_decode_roofline.py results.json (default
    benchmark/decode_roofline/results.json)."""
    try:
        with open(path) as f:
            rows = json.load(f)["decode"]
    except (OSError, KeyError, ValueError):
        return {}
    return {r["batch"]: r["step_ms"] for r in rows if r.get("context") == 1024}


def run_bench(
    bench_py: str,
    python: str,
    backend: str,
    base_url: str,
    tokenizer: str,
    dataset: str,
    out_file: str,
    concurrency: int,
    num_prompts: int,
    in_len: int,
    out_len: int,
    log,
) -> dict:
    args = [
        python,
        bench_py,
        "--backend",
        backend,
        "--base-url",
        base_url,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--dataset-path",
        dataset,
        "--random-input-len",
        str(in_len),
        "--random-output-len",
        str(out_len),
        "--random-range-ratio",
        "1",
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--flush-cache",
        "--output-file",
        out_file,
        "--disable-tqdm",
    ]
    print("$", " ".join(args[1:]), file=log, flush=True)
    proc = subprocess.run(
        args, cwd=os.path.dirname(out_file), env=client_env(), capture_output=True, text=True, timeout=900
    )
    log.write(proc.stdout + proc.stderr)
    log.flush()
    if proc.returncode != 0:
        raise RuntimeError(f"bench_serving failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return last_json_line(out_file)


def server_facts(base_url: str) -> dict:
    import requests

    info = requests.get(f"{base_url}/server_info", timeout=30).json()
    plan = info.get("memory_plan") or {}
    return {
        "max_total_num_tokens": info.get("max_total_num_tokens"),
        "cuda_graph_max_bs": info.get("cuda_graph_max_bs"),
        "max_running_requests": info.get("max_running_requests"),
        "kv_path": plan.get("path"),
        # What the weights took (native block-fp8 Llama-3.1-8B ~9 GB vs 16 GB in bf16): which format was served.
        "weights_gb": plan.get("weights_gb"),
    }


# Scheduler counters read before and after each run (SchedulerStats; device_timeline.py for the device ones).
# DEVICE_SECONDS: the device's busy and idle-gap seconds; what they leave of a run's duration had no work queued.
DEVICE_SECONDS = (
    "prefill_device_seconds",
    "decode_device_seconds",
    "device_gap_before_prefill_seconds",
    "device_gap_before_decode_seconds",
)
COUNTERS = ("decode_periods", "decode_period_seconds", "prefill_batches", "decode_batches", *DEVICE_SECONDS)


def scheduler_counters(base_url: str) -> Dict[str, float]:
    """COUNTERS so far, from /server_info's scheduler stats (refreshed every 0.5 s)."""
    import requests

    time.sleep(0.6)  # the latest stats, not those of half a second ago
    stats = requests.get(f"{base_url}/server_info", timeout=30).json().get("scheduler_stats") or {}
    return {k: stats.get(k, 0) for k in COUNTERS}


def device_time_columns(before: Dict[str, float], after: Dict[str, float], duration_s: float) -> dict:
    """Where the run's wall time went on the device: prefill, decode, gaps while the scheduler had work (host
    work not hidden), and the rest (the scheduler had nothing to run: waiting for the client / HTTP process)."""
    d = {k: after[k] - before[k] for k in COUNTERS}
    accounted = sum(d[k] for k in DEVICE_SECONDS)
    return {
        "server_decode_period_ms": d["decode_period_seconds"] / d["decode_periods"] * 1000
        if d["decode_periods"]
        else None,
        "prefill_batches": d["prefill_batches"],
        "prefill_device_s": d["prefill_device_seconds"],
        "decode_batches": d["decode_batches"],
        "decode_device_s": d["decode_device_seconds"],
        "gap_before_prefill_s": d["device_gap_before_prefill_seconds"],
        "gap_before_decode_s": d["device_gap_before_decode_seconds"],
        "no_work_s": duration_s - accounted,
    }


def markdown(data: dict) -> str:
    lines = [
        f"Upstream `bench_serving.py` (sglang {UPSTREAM_VERSION}) `--backend {data['backend']}`, random dataset "
        f"{data['input_len']} in / {data['output_len']} out, model {data['model']} (weights: {data['weights']}); "
        "graph step ms: benchmark/decode_roofline/ at the same batch size, context 1024.",
        "",
        "| variant | path | concurrency | prompts | completed | output tok/s | TTFT median ms | TTFT p99 ms "
        "| ITL median ms | ITL p99 ms | server decode period ms | graph step ms | ITL median / step | KV tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        step = "-" if r["graph_step_ms"] is None else f"{r['graph_step_ms']:.3f}"
        ratio = "-" if r["itl_over_graph_step"] is None else f"{r['itl_over_graph_step']:.2f}"
        period = "-" if r.get("server_decode_period_ms") is None else f"{r['server_decode_period_ms']:.2f}"
        lines.append(
            f"| {r.get('variant', 'default')} | {r['path']} | {r['concurrency']} | {r['num_prompts']} | {r['completed']} "
            f"| {r['output_throughput']:.1f} | {r['median_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} "
            f"| {r['median_itl_ms']:.2f} | {r['p99_itl_ms']:.2f} | {period} | {step} | {ratio} "
            f"| {r['max_total_num_tokens']} |"
        )
    timed = [r for r in data["rows"] if r.get("prefill_batches") is not None]
    if timed:
        lines += [
            "",
            "Device time of each run (the server's scheduler stats): prefill and decode batches, the device's idle "
            "gaps between batches while the scheduler had work, and the rest of the run's duration (no work queued).",
            "",
            "| variant | concurrency | duration s | prefill batches | prefill s | decode batches | decode s "
            "| gap before prefill s | gap before decode s | no work s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in timed:
            lines.append(
                f"| {r.get('variant', 'default')} | {r['concurrency']} | {r['duration_s']:.2f} | {r['prefill_batches']} "
                f"| {r['prefill_device_s']:.2f} | {r['decode_batches']} | {r['decode_device_s']:.2f} "
                f"| {r['gap_before_prefill_s']:.2f} | {r['gap_before_decode_s']:.2f} | {r['no_work_s']:.2f} |"
            )
    return "\n".join(lines)


def run(args) -> dict:
    wheels = sorted(glob.glob(os.path.join(STAGE, f"sglang-{UPSTREAM_VERSION}-*.whl")))
    if not wheels or not os.path.isfile(os.path.join(TOKENIZER_DIR, "tokenizer.json")):
        raise SystemExit(f"{STAGE} lacks the wheel or the tokenizer: run this script with --prepare first (here)")
    work = tempfile.mkdtemp(prefix="bench-serving-")
    try:
        return _run_in(work, wheels[0], args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Setup:
    """What every server of one invocation shares: the client script, the model and the prompts."""

    work: str  # temporary directory
    bench_py: str  # upstream's bench_serving.py, unpacked
    python: str  # its interpreter
    model_dir: str
    dataset: str
    graph_steps: Dict[int, float]  # decode graph step ms by batch size (H200 runs only)
    dummy: bool  # --load-format dummy (False: the model directory holds real weights)
    fp8_model_dir: Optional[str]  # the shape as a native block-fp8 checkpoint (variants with --checkpoint-fp8)


CHECKPOINT_FP8 = "--checkpoint-fp8"  # a variant's flag taken here: serve Setup.fp8_model_dir


def _model_dirs(work: str, args) -> tuple[str, bool, Optional[str], dict]:
    """(the model directory, whether its weights are dummy, the block-fp8 one for variants that ask, facts to
    record): --model-path as given, the written checkpoint, or the shape's dummy-weight directories."""
    if args.model_path:
        return args.model_path, False, None, {}
    if args.write_fp8_checkpoint:
        d, facts = written_fp8_checkpoint(work, args.shape)
        return d, False, None, facts
    wants_fp8 = any(CHECKPOINT_FP8 in flags for _, flags in parse_variants(args.variants))
    fp8_dir = model_dir(work, args.shape, checkpoint_fp8=True) if wants_fp8 else None
    return model_dir(work, args.shape), True, fp8_dir, {}


def _run_in(work: str, wheel: str, args) -> dict:
    main_dir, dummy, fp8_dir, facts = _model_dirs(work, args)
    setup = Setup(
        work=work,
        bench_py=os.path.join(unpack_wheel(wheel, os.path.join(work, "upstream")), "bench_serving.py"),
        python=args.client_python or sys.executable,
        model_dir=main_dir,
        dataset=write_corpus(os.path.join(work, "corpus.json"), max(args.num_prompts) + 1, args.input_len * 2),
        graph_steps=roofline_steps(args.graph_steps_from)
        if args.roofline
        else {},  # H200 step times: meaningless next to a CPU run
        dummy=dummy,
        fp8_model_dir=fp8_dir,
    )
    os.makedirs(args.out_dir, exist_ok=True)
    weights = "dummy" if dummy else "real"
    if args.write_fp8_checkpoint:
        weights = "random block-fp8 checkpoint written to disk"
    data = {
        "upstream": UPSTREAM_VERSION,
        "backend": args.backend,
        "model": args.model_label or args.shape,
        "weights": weights,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "server_args": args.server_args,
        **facts,
        "rows": [],
    }
    with open(os.path.join(args.out_dir, "bench_serving_runs.log"), "a") as log:
        for label, flags in parse_variants(args.variants):
            for path in args.paths:
                run_server(args, setup, data, log, label, flags, path)
    print(markdown(data))
    return data


def _checkpoint_kind(args, fp8_dir: bool) -> str:
    """What a row's server loaded (its flags may quantize it further: --quantization fp8)."""
    if args.model_path:
        return "as given"
    if args.write_fp8_checkpoint:
        return "block-fp8, written"
    return "block-fp8, dummy" if fp8_dir else "bf16, dummy"


def parse_variants(specs: Sequence[str]) -> List[tuple]:
    """ "label=--flag value ..." -> (label, [flags]); a variant is the same server with some flags added."""
    out = []
    for spec in specs:
        label, sep, flags = spec.partition("=")
        if not sep or not label:
            raise SystemExit(f"--variants takes label=flags, got {spec!r}")
        out.append((label, flags.split()))
    return out


def run_server(args, setup: Setup, data: dict, log, label: str, flags: List[str], path: str) -> None:
    """One server (a variant on a KV sizing path): the warm-up, then every concurrency, rows into `data`."""
    name = path if label == "default" else f"{label}-{path}"
    model = setup.fp8_model_dir if CHECKPOINT_FP8 in flags else setup.model_dir
    server_cmd = [
        "--model-path",
        model,
        *(["--load-format", "dummy"] if setup.dummy else []),
        *args.server_args,
        *[f for f in flags if f != CHECKPOINT_FP8],
    ]
    t0 = time.monotonic()
    proc = popen_launch_server(server_cmd, timeout=900, env={"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": PATHS[path]})
    try:
        facts = server_facts(proc.base_url)
        print(f"[{name}] server up in {proc.startup_seconds:.1f} s: {facts}", flush=True)
        if args.check_path and facts["kv_path"] != path:
            raise RuntimeError(f"asked for the {path} path, the server's memory plan says {facts['kv_path']}")
        out = os.path.join(setup.work, f"{name}.jsonl")

        def bench(concurrency: int, prompts: int, output_len: int) -> dict:
            return run_bench(
                setup.bench_py,
                setup.python,
                args.backend,
                proc.base_url,
                TOKENIZER_DIR,
                setup.dataset,
                out,
                concurrency,
                prompts,
                args.input_len,
                output_len,
                log,
            )

        # Unrecorded warm-up: compiles every prefill/decode kernel shape the runs below meet.
        bench(args.warmup_concurrency, args.warmup_prompts, 16)
        for conc, n in zip(args.concurrency, args.num_prompts):
            t = time.monotonic()
            before = scheduler_counters(proc.base_url)
            res = bench(conc, n, args.output_len)
            step = setup.graph_steps.get(conc)
            # The server's own loop period while decoding: next to ITL it tells whether the gap is the
            # scheduler's (period above the graph step) or downstream (detokenizer, HTTP, the client).
            device = device_time_columns(before, scheduler_counters(proc.base_url), res["duration"])
            row = {
                "variant": label,
                "checkpoint": _checkpoint_kind(args, model != setup.model_dir),
                "path": path,
                "concurrency": conc,
                "num_prompts": n,
                "completed": res["completed"],
                "output_throughput": res["output_throughput"],
                "median_ttft_ms": res["median_ttft_ms"],
                "p99_ttft_ms": res["p99_ttft_ms"],
                "median_itl_ms": res["median_itl_ms"],
                "p99_itl_ms": res["p99_itl_ms"],
                "graph_step_ms": step,
                "itl_over_graph_step": None if step is None else res["median_itl_ms"] / step,
                "mean_itl_ms": res["mean_itl_ms"],
                "median_tpot_ms": res["median_tpot_ms"],
                "median_e2e_latency_ms": res["median_e2e_latency_ms"],
                "request_throughput": res["request_throughput"],
                "duration_s": res["duration"],
                "total_input_tokens": res["total_input_tokens"],
                "total_output_tokens": res["total_output_tokens"],
                "server_startup_s": proc.startup_seconds,
                **device,
                **facts,
            }
            data["rows"].append(row)
            write_results(args.out_dir, data, markdown(data))
            print(
                f"[{name}] concurrency {conc}: {res['completed']}/{n} completed, "
                f"{res['output_throughput']:.1f} tok/s, ITL median {res['median_itl_ms']:.2f} ms "
                f"({time.monotonic() - t:.1f} s)",
                flush=True,
            )
    finally:
        kill_process_tree(proc.pid)
        proc.wait(30)
        with open(os.path.join(args.out_dir, f"server-{name}.log"), "w") as f:
            f.write(read_log(proc))
    print(f"[{name}] done in {time.monotonic() - t0:.1f} s", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepare", action="store_true", help="fetch the wheel, save the tokenizer")
    p.add_argument("--dry-run", action="store_true", help="CPU check of the whole script: tiny model, tiny counts")
    p.add_argument("--out-dir", default=HERE)
    p.add_argument("--shape", default="Llama-3.1-8B")
    p.add_argument("--model-path", help="serve this model (real weights) instead of the shape with dummy weights")
    p.add_argument(
        "--write-fp8-checkpoint",
        action="store_true",
        help="write the shape as a native block-fp8 checkpoint (random weights) and serve it with a real load",
    )
    p.add_argument("--model-label")
    p.add_argument("--backend", default="sglang", choices=["sglang", "sglang-oai", "vllm"])
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    p.add_argument(
        "--variants",
        nargs="+",
        default=["default="],
        help='servers to compare, each "label=extra launch_server flags" (e.g. "overlap=" '
        '"no-overlap=--disable-overlap-schedule"), each run on every --paths',
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--num-prompts", type=int, nargs="+", default=[16, 128, 512])
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--warmup-concurrency", type=int, default=64)
    p.add_argument("--warmup-prompts", type=int, default=64)
    p.add_argument(
        "--no-check-path",
        dest="check_path",
        action="store_false",
        help="do not require /server_info's memory_plan.path to be the path asked for",
    )
    p.add_argument(
        "--graph-steps-from",
        help="the decode roofline results.json whose step times sit next to the ITL (default: the committed one, "
        "Llama-3.1-8B's; none for other shapes)",
    )
    p.add_argument("--client-python", help="interpreter for bench_serving (default: this one)")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="extra launch_server flags (last)")
    args = p.parse_args(argv)
    if args.prepare:
        return prepare()
    if args.dry_run:
        from sglang.test.upstream_clients import ensure_upstream_venv

        args.shape = "tiny-qwen3" if args.shape.startswith("Qwen3") else "tiny-llama"
        args.out_dir = args.out_dir if args.out_dir != HERE else tempfile.mkdtemp(prefix="bench-serving-dry-")
        args.concurrency, args.num_prompts, args.input_len, args.output_len = [1, 2, 4], [2, 4, 8], 32, 8
        args.warmup_concurrency, args.warmup_prompts = 2, 2
        args.roofline, args.check_path = False, False  # CPU: no H200 step times; the flag needs CUDA
        args.server_args = ["--device", "cpu", "--max-total-tokens", "8192", *args.server_args]
        # This machine's project env lacks aiohttp: use the upstream-clients venv's interpreter (the wheel's
        # unpacked script still runs, with the venv's packages).
        args.client_python = args.client_python or ensure_upstream_venv().python
    else:
        args.roofline = True
    if len(args.concurrency) != len(args.num_prompts):
        p.error("--concurrency and --num-prompts need the same number of values")
    fp8_variants = any(CHECKPOINT_FP8 in flags for _, flags in parse_variants(args.variants))
    if args.write_fp8_checkpoint and (args.model_path or fp8_variants):
        p.error("--write-fp8-checkpoint serves the checkpoint it writes: no --model-path, no --checkpoint-fp8 variants")
    if args.model_path and fp8_variants:
        p.error("--checkpoint-fp8 variants serve the shape's dummy-weight config: not with --model-path")
    if args.graph_steps_from is None:
        args.graph_steps_from = ROOFLINE if args.shape == "Llama-3.1-8B" else ""
    run(args)
    print("results in", args.out_dir)


if __name__ == "__main__":
    main()
