"""EleutherAI's lm-eval (PyPI `lm-eval==0.4.13`, in its own virtualenv: python/sglang/test/lm_eval_client.py)
scores our server (SmolLM2 on CPU) through `local-completions`, on two tasks defined here from local JSONL
files (a task YAML in a temp dir, `--include_path`; no model or dataset hub):
  * a multiple-choice task (loglikelihoods: /v1/completions with echo + logprobs): every choice's
    loglikelihood equals the sum of our native /generate prompt logprobs over the same continuation tokens,
    and lm-eval's `acc` is the accuracy of the argmax of those sums;
  * a generate_until task: every answer equals our own greedy /generate with the same stop strings.
The tokenizer is a local directory saved from the server's own (lm-eval's `remote` tokenizer speaks vLLM's
/tokenizer_info, which an SGLang server does not serve)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import requests

from sglang.test.client_venv import client_env
from sglang.test.lm_eval_client import ensure_lm_eval_venv
from sglang.test.runners import SMOLLM2
from sglang.test.upstream_clients import save_portable_tokenizer

TIMEOUT = 300
LOGPROB_ATOL = 1e-3  # the same server scores both; batches of different shapes may differ in the last bits
MC_DOCS = [
    {"question": "The capital of France is", "choices": ["Paris", "Berlin", "Madrid"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["five", "four", "seven"], "answer": 1},
    {"question": "The opposite of hot is", "choices": ["warm", "loud", "cold"], "answer": 2},
    {"question": "A baby cat is called a", "choices": ["kitten", "puppy", "calf"], "answer": 0},
]
GEN_DOCS = [
    {"question": "The capital of France is", "answer": "Paris"},
    {"question": "Monday, Tuesday, Wednesday,", "answer": "Thursday"},
    {"question": "The largest planet of the solar system is", "answer": "Jupiter"},
]
GEN_UNTIL = ["\n", ".", ","]
GEN_MAX_TOKENS = 8
TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
doc_to_text: "{{{{question}}}}"
doc_to_target: {target}
{extra}
metric_list:
  - metric: {metric}{metric_args}
"""


def write_tasks(root: Path) -> None:
    (root / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (root / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in GEN_DOCS))
    mc = TASK_YAML.format(
        name="postcap_mc",
        data=root / "mc.jsonl",
        output_type="multiple_choice",
        target='"{{answer}}"',
        extra='doc_to_choice: "{{choices}}"\ntarget_delimiter: " "',
        metric="acc",
        metric_args="",
    )
    gen = TASK_YAML.format(
        name="postcap_gen",
        data=root / "gen.jsonl",
        output_type="generate_until",
        target='"{{answer}}"',
        extra=f"generation_kwargs:\n  until: {json.dumps(GEN_UNTIL)}\n  max_gen_toks: {GEN_MAX_TOKENS}\n"
        "  do_sample: false",
        metric="exact_match",
        metric_args='\n    regexes_to_ignore: [" "]',  # the answer follows its prompt after a space
    )
    (root / "postcap_mc.yaml").write_text(mc)
    (root / "postcap_gen.yaml").write_text(gen)


@pytest.fixture(scope="module")
def base_url(smollm2_server) -> str:
    return smollm2_server.base_url  # shared with the other modules here (conftest.py)


@pytest.fixture(scope="module")
def lm_eval_run(base_url, tmp_path_factory) -> Tuple[Dict[str, dict], Dict[str, List[dict]]]:
    """Run lm-eval once on both tasks; (its results per task, its logged samples per task)."""
    from sglang.srt.utils.hf_tokenizer import get_tokenizer

    with ThreadPoolExecutor(1) as pool:  # the venv builds (first time only) while the tokenizer is saved
        python = pool.submit(ensure_lm_eval_venv)
        root = tmp_path_factory.mktemp("lm-eval")
        tokenizer_dir = save_portable_tokenizer(get_tokenizer(SMOLLM2), str(root / "tokenizer"))
        write_tasks(root)
        python = python.result()
    model_args = ",".join(
        [
            "model=default",
            f"base_url={base_url}/v1/completions",
            "tokenizer_backend=huggingface",
            f"tokenizer={tokenizer_dir}",
            "num_concurrent=2",
            "max_retries=1",
            "max_length=2048",
        ]
    )
    cmd = [python, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args]
    cmd += ["--tasks", "postcap_mc,postcap_gen", "--include_path", str(root), "--batch_size", "1"]
    cmd += ["--output_path", str(root / "out"), "--log_samples"]
    env = client_env({"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(root / "hf-home")})
    proc = subprocess.run(cmd, cwd=str(root), env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"lm-eval failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    (results_file,) = (root / "out").rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    samples = {}
    for task in ("postcap_mc", "postcap_gen"):
        (f,) = (root / "out").rglob(f"samples_{task}_*.jsonl")
        samples[task] = sorted((json.loads(line) for line in f.read_text().splitlines()), key=lambda s: s["doc_id"])
    return results, samples


def tokenize(base_url: str, text: str) -> List[int]:
    r = requests.post(f"{base_url}/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def native_loglikelihood(base_url: str, context: str, continuation: str) -> float:
    """Our /generate's prompt logprobs summed over the continuation's tokens, split as lm-eval splits a
    (context, continuation) pair: trailing spaces of the context move to the continuation, the whole text
    is tokenized once and the continuation is what follows the context's own tokens."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, ctx = tokenize(base_url, context + continuation), tokenize(base_url, context)
    body = {
        "input_ids": whole,
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
    }
    r = requests.post(f"{base_url}/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    logprobs = [e[0] for e in r.json()["meta_info"]["input_token_logprobs"]]
    assert len(logprobs) == len(whole)
    return sum(logprobs[len(ctx) :])


def test_multiple_choice_loglikelihoods_equal_native_prompt_logprobs(base_url, lm_eval_run):
    results, samples = lm_eval_run
    assert [s["doc_id"] for s in samples["postcap_mc"]] == list(range(len(MC_DOCS)))
    correct = 0
    for sample, doc in zip(samples["postcap_mc"], MC_DOCS):
        scored = [resp[0][0] for resp in sample["resps"]]  # per choice [[loglikelihood, is_greedy]]
        expected = []
        # each choice's request as logged: {"gen_args_<i>": {"arg_0": context, "arg_1": continuation}}
        pairs = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
        for (context, continuation), choice in zip(pairs, doc["choices"]):
            assert context == doc["question"] and continuation == " " + choice
            expected.append(native_loglikelihood(base_url, context, continuation))
        assert [float(x) for x in scored] == pytest.approx(expected, abs=LOGPROB_ATOL)
        correct += max(range(len(expected)), key=expected.__getitem__) == doc["answer"]
    assert results["postcap_mc"]["acc,none"] == pytest.approx(correct / len(MC_DOCS))


def test_generate_until_answers_equal_native_greedy(base_url, lm_eval_run):
    results, samples = lm_eval_run
    assert [s["doc_id"] for s in samples["postcap_gen"]] == list(range(len(GEN_DOCS)))
    prompts = [d["question"] for d in GEN_DOCS]
    params = {"temperature": 0, "max_new_tokens": GEN_MAX_TOKENS, "stop": GEN_UNTIL}
    r = requests.post(f"{base_url}/generate", json={"text": prompts, "sampling_params": params}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    native = [o["text"] for o in r.json()]
    answers = [s["resps"][0][0] for s in samples["postcap_gen"]]
    assert answers == native
    matches = [a.replace(" ", "") == d["answer"] for a, d in zip(answers, GEN_DOCS)]
    assert results["postcap_gen"]["exact_match,none"] == pytest.approx(sum(matches) / len(GEN_DOCS))
