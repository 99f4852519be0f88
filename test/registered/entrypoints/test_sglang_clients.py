"""Upstream SGLang's own clients, unchanged, against our server (SmolLM2 on CPU).

The clients come from the PyPI wheel `sglang==0.4.6.post5`, installed in a virtualenv of their own
(python/sglang/test/upstream_clients.py; our import package is also `sglang`) and run as subprocesses:
  * `bench_serving.py` with --backend sglang / sglang-oai / vllm: every request completes and the texts
    equal our own greedy /generate for the same prompts;
  * the frontend language (`sgl.RuntimeEndpoint`): gen with stop, streamed gen, select (the choice and its
    prompt logprobs against transformers on the same GGUF weights), multi-turn chat with the ChatML
    template, fork;
  * `sglang.test.few_shot_gsm8k --data-path` on a small GSM8K-format file;
and the `openai` client (project env) for top logprobs (checked against transformers), n=2, models.retrieve.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=55, suite="per-commit-cpu")

import json
import re
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

import openai
import pytest
import requests
import torch

from sglang.test.runners import SMOLLM2, load_hf_model
from sglang.test.upstream_clients import (
    UPSTREAM_VERSION,
    UpstreamClients,
    ensure_upstream_venv,
    last_json_line,
    save_portable_tokenizer,
)

TIMEOUT = 180  # per request or client run: a shared 2-core CI machine can be slowed down a lot
LOGPROB_ATOL = 1e-3  # fp32 on both sides; the in-process comparison holds 1e-4, HTTP adds nothing but JSON


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def clients() -> UpstreamClients:
    c = ensure_upstream_venv()  # built once per machine (~20 s from PyPI), then reused
    assert c.package_dir.is_relative_to(c.venv), f"upstream sglang resolved outside its venv: {c.package_dir}"
    return c


@pytest.fixture(scope="module")
def base_url(smollm2_server) -> str:
    return smollm2_server.base_url  # shared with the other modules here (conftest.py)


@pytest.fixture(scope="module")
def tok():
    from sglang.srt.utils.hf_tokenizer import get_tokenizer

    return get_tokenizer(SMOLLM2)  # the converted GGUF tokenizer the server uses (cached on disk)


@pytest.fixture(scope="module")
def tokenizer_dir(tok, tmp_path_factory) -> str:
    return save_portable_tokenizer(tok, str(tmp_path_factory.mktemp("smollm2-tokenizer")))


@pytest.fixture(scope="module")
def hf():
    return load_hf_model(SMOLLM2)  # transformers dequantizes the same GGUF file, fp32


@pytest.fixture(scope="module")
def oai(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)


def generate(base_url: str, **body):
    r = requests.post(f"{base_url}/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, f"/generate {body}: {r.status_code} {r.text}"
    return r.json()


def tail(proc) -> str:
    return f"\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


@torch.no_grad()
def hf_greedy_top(hf, ids: List[int], steps: int, k: int) -> List[List[Tuple[int, float]]]:
    """transformers' greedy path from `ids`: per step the top-k (token id, logprob), best first."""
    x = torch.tensor([list(ids)])
    # generate() keeps a KV cache (one token a step) and hands back the raw logits of every step.
    res = hf.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        temperature=None,
        top_p=None,
        top_k=None,
        output_logits=True,
        return_dict_in_generate=True,
    )
    out = []
    for step_logits in res.logits:
        vals, idx = torch.log_softmax(step_logits[0].float(), -1).topk(k)
        out.append([(int(i), float(v)) for i, v in zip(idx, vals)])
    return out


@torch.no_grad()
def hf_token_logprobs(hf, ids: List[int]) -> List[float]:
    """logprob of ids[j] given ids[:j], for j = 1 .. len(ids)-1 (index j-1 of the result)."""
    lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    return [float(lp[j - 1, ids[j]]) for j in range(1, len(ids))]


# ---------------------------------------------------------------- bench_serving
BENCH_IN, BENCH_OUT = 16, 12
BENCH_TEXTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg built a machine",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make sugar",
    "To bake a simple loaf of bread you need flour, water, yeast and salt, mixed and kneaded into a dough",
    "The Pacific Ocean is the largest and deepest of the oceans of the world, stretching from the Arctic",
]


@pytest.fixture(scope="module")
def bench_prompts(tok) -> List[str]:
    """Prompts of exactly BENCH_IN tokens that survive encode/decode unchanged, so the text bench_serving's
    random dataset sends (its ids cut to BENCH_IN tokens, decoded) is exactly this text."""
    prompts = []
    for t in BENCH_TEXTS:
        p = tok.decode(tok.encode(t, add_special_tokens=False)[:BENCH_IN])
        ids = tok.encode(p, add_special_tokens=False)
        assert len(ids) == BENCH_IN and tok.decode(ids) == p, p
        prompts.append(p)
    return prompts


@pytest.fixture(scope="module")
def bench_dataset(bench_prompts, tmp_path_factory) -> str:
    # ShareGPT's layout, which `--dataset-name random` reads from --dataset-path (no download then).
    rows = [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "-"}]} for p in bench_prompts]
    path = tmp_path_factory.mktemp("bench") / "sharegpt.json"
    path.write_text(json.dumps(rows))
    return str(path)


@pytest.fixture(scope="module")
def bench_reference(base_url, bench_prompts) -> List[str]:
    """Our own greedy /generate, with the sampling bench_serving asks for (greedy, ignore_eos)."""
    params = {"temperature": 0, "max_new_tokens": BENCH_OUT, "ignore_eos": True}
    outs = generate(base_url, text=bench_prompts, sampling_params=params)
    assert all(o["meta_info"]["completion_tokens"] == BENCH_OUT for o in outs)
    return [o["text"] for o in outs]


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "vllm"])
def test_bench_serving(
    backend, clients, base_url, tokenizer_dir, bench_dataset, bench_prompts, bench_reference, tmp_path
):
    out_file = tmp_path / "bench.jsonl"
    n = len(bench_prompts)
    proc = clients.run(
        [
            clients.module_file("bench_serving.py"),
            "--backend",
            backend,
            "--base-url",
            base_url,
            "--dataset-name",
            "random",
            "--dataset-path",
            bench_dataset,
            "--tokenizer",
            tokenizer_dir,
            "--num-prompts",
            str(n),
            "--random-input-len",
            str(BENCH_IN),
            "--random-output-len",
            str(BENCH_OUT),
            "--random-range-ratio",
            "1",
            "--output-file",
            str(out_file),
            "--output-details",
            "--disable-tqdm",
        ],
        cwd=str(tmp_path),
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"bench_serving --backend {backend} failed{tail(proc)}"
    res = last_json_line(str(out_file))
    assert res["errors"] == [""] * n, res["errors"]
    assert res["completed"] == n and res["input_lens"] == [BENCH_IN] * n
    assert res["output_lens"] == [BENCH_OUT] * n, res["output_lens"]
    # bench_serving shuffles its dataset and does not record prompts; compare as multisets (the reference
    # texts are distinct, so a request answered with another prompt's continuation still fails).
    assert len(set(bench_reference)) == n
    got, want = Counter(res["generated_texts"]), Counter(bench_reference)
    assert got == want, f"only in bench: {list(got - want)}; only in ours: {list(want - got)}"
    # Streamed: a first token, then the rest in later chunks (the latencies bench_serving reports).
    assert all(t > 0 for t in res["ttfts"]) and all(len(itl) >= 1 for itl in res["itls"]), res["itls"]
    assert res["output_throughput"] > 0 and res["median_ttft_ms"] > 0


# ---------------------------------------------------------------- the frontend language
# Runs in the venv: a program per case, each result (or its error) recorded, so one failure hides no other.
FRONTEND_SCRIPT = r"""
import json, sys, traceback
import sglang as sgl

cfg = json.load(open(sys.argv[1]))
url = cfg["url"]
sgl.set_default_backend(sgl.RuntimeEndpoint(url))
results = {}

def record(name, fn):
    try:
        results[name] = fn()
    except Exception:
        results[name] = {"error": traceback.format_exc()}

def done(state, **getters):
    # A failed request surfaces as state.error() (the interpreter only warns); read variables after.
    err = state.error()
    if err is not None:
        return {"error": repr(err)}
    return {"error": None, "text": state.text(), **{k: get() for k, get in getters.items()}}

@sgl.function
def gen_stop(s):
    s += cfg["gen_prompt"]
    s += sgl.gen("ans", max_tokens=cfg["gen_max_tokens"], stop=cfg["gen_stop"], temperature=0)

def run_gen():
    st = gen_stop.run()
    return done(st, ans=lambda: st["ans"], meta=lambda: st.get_meta_info("ans"))

def run_gen_stream():
    st = gen_stop.run(stream=True)
    pieces = list(st.text_iter("ans"))
    return done(st, pieces=lambda: pieces, ans=lambda: st["ans"])

@sgl.function
def pick(s):
    s += cfg["select_prompt"]
    s += sgl.select("pick", choices=cfg["choices"])

def run_select():
    st = pick.run()
    return done(st, pick=lambda: st["pick"], meta=lambda: st.get_meta_info("pick"))

@sgl.function
def chat(s):
    s += sgl.system(cfg["system"])
    s += sgl.user(cfg["q1"])
    s += sgl.assistant(sgl.gen("a1", max_tokens=cfg["chat_max_tokens"], temperature=0))
    s += sgl.user(cfg["q2"])
    s += sgl.assistant(sgl.gen("a2", max_tokens=cfg["chat_max_tokens"], temperature=0))

def run_chat():
    # SmolLM2 is not in upstream's model-name table: its users name the ChatML template, as here.
    st = chat.run(backend=sgl.RuntimeEndpoint(url, chat_template_name="chatml"))
    return done(st, a1=lambda: st["a1"], a2=lambda: st["a2"], messages=st.messages)

@sgl.function
def forked(s):
    s += cfg["fork_prefix"]
    forks = s.fork(len(cfg["fork_suffixes"]))
    for f, suffix in zip(forks, cfg["fork_suffixes"]):
        f += suffix
        f += sgl.gen("x", max_tokens=cfg["fork_max_tokens"], stop="\n", temperature=0)
    forks.join()
    for f in forks:
        s += f["x"] + "\n"

def run_fork():
    st = forked.run()
    return done(st)

for name, fn in [("gen", run_gen), ("gen_stream", run_gen_stream), ("select", run_select), ("chat", run_chat),
                 ("fork", run_fork)]:
    record(name, fn)
json.dump(results, open(cfg["out"], "w"))
"""

GEN_PROMPT = "The three primary colors are"
SELECT_PROMPT = "The capital of France is"
CHOICES = [" Paris", " London", " a banana", " the moon"]
CHAT = {
    "system": "You are a concise assistant.",
    "q1": "What is the capital of France?",
    "q2": "And what is the capital of Italy?",
}
FORK_PREFIX = "Here are two facts about the sea.\n"
FORK_SUFFIXES = ["Fact 1:", "Fact 2:"]
GEN_MAX, CHAT_MAX, FORK_MAX = 16, 12, 8


@pytest.fixture(scope="module")
def gen_stop_word(base_url) -> str:
    """A stop string the greedy continuation really contains (its third word), so the stop must act."""
    text = generate(base_url, text=GEN_PROMPT, sampling_params={"temperature": 0, "max_new_tokens": GEN_MAX})["text"]
    words = text.split()
    assert len(words) >= 3, f"need three words in the greedy output, got {text!r}"
    return words[2]


@pytest.fixture(scope="module")
def frontend(clients, base_url, gen_stop_word, tmp_path_factory) -> Dict[str, dict]:
    d = tmp_path_factory.mktemp("frontend")
    cfg = {
        "url": base_url,
        "out": str(d / "results.json"),
        "gen_prompt": GEN_PROMPT,
        "gen_stop": gen_stop_word,
        "gen_max_tokens": GEN_MAX,
        "select_prompt": SELECT_PROMPT,
        "choices": CHOICES,
        **CHAT,
        "chat_max_tokens": CHAT_MAX,
        "fork_prefix": FORK_PREFIX,
        "fork_suffixes": FORK_SUFFIXES,
        "fork_max_tokens": FORK_MAX,
    }
    (d / "cfg.json").write_text(json.dumps(cfg))
    (d / "program.py").write_text(FRONTEND_SCRIPT)
    proc = clients.run([str(d / "program.py"), str(d / "cfg.json")], cwd=str(d), timeout=TIMEOUT)
    assert proc.returncode == 0, f"frontend program crashed{tail(proc)}"
    results = json.loads((d / "results.json").read_text())
    results["_stderr"] = proc.stderr  # the interpreter reports a failed request only as a warning
    return results


def frontend_result(frontend: Dict[str, dict], name: str) -> dict:
    r = frontend[name]
    assert r.get("error") is None, f"{name}: {r['error']}\n--- client stderr ---\n{frontend['_stderr'][-3000:]}"
    return r


def test_frontend_gen_with_stop(frontend, base_url, gen_stop_word):
    r = frontend_result(frontend, "gen")
    ours = generate(
        base_url, text=GEN_PROMPT, sampling_params={"temperature": 0, "max_new_tokens": GEN_MAX, "stop": gen_stop_word}
    )
    full = generate(base_url, text=GEN_PROMPT, sampling_params={"temperature": 0, "max_new_tokens": GEN_MAX})
    assert r["ans"] == ours["text"]
    assert gen_stop_word not in r["ans"] and full["text"].startswith(r["ans"]) and len(r["ans"]) < len(full["text"])
    assert r["text"] == GEN_PROMPT + r["ans"]
    assert r["meta"]["finish_reason"]["type"] == "stop"


def test_frontend_gen_stream(frontend):
    r = frontend_result(frontend, "gen_stream")
    assert len(r["pieces"]) >= 2, r["pieces"]  # streamed, not in one piece
    assert "".join(r["pieces"]) == r["ans"] == frontend_result(frontend, "gen")["ans"]


def test_frontend_select_matches_transformers(frontend, tok, hf):
    r = frontend_result(frontend, "select")
    entries = r["meta"]["input_token_logprobs"]  # per choice: (logprob, token id, text) from logprob_start_len
    assert len(entries) == len(CHOICES)
    hf_scores = []
    for choice, ent in zip(CHOICES, entries):
        ids = tok.encode(SELECT_PROMPT + choice, add_special_tokens=False)
        assert 2 <= len(ent) < len(ids), ent
        assert [e[1] for e in ent] == ids[-len(ent) :], (choice, ent)
        ref = hf_token_logprobs(hf, ids)[-len(ent) :]
        got = [e[0] for e in ent]
        assert all(g is not None for g in got), ent
        assert torch.allclose(torch.tensor(got), torch.tensor(ref), atol=LOGPROB_ATOL), (choice, got, ref)
        hf_scores.append(sum(ref) / len(ref))  # the client's default rule: token-length-normalized logprob
    assert torch.allclose(
        torch.tensor(r["meta"]["normalized_prompt_logprobs"]), torch.tensor(hf_scores), atol=LOGPROB_ATOL
    )
    ranked = sorted(hf_scores, reverse=True)
    assert ranked[0] - ranked[1] > 10 * LOGPROB_ATOL, f"choices too close to rank reliably: {hf_scores}"
    assert r["pick"] == CHOICES[hf_scores.index(ranked[0])]
    assert r["text"] == SELECT_PROMPT + r["pick"]


def test_frontend_multi_turn_chat(frontend, tok, oai):
    r = frontend_result(frontend, "chat")
    msgs = [
        {"role": "system", "content": CHAT["system"]},
        {"role": "user", "content": CHAT["q1"]},
        {"role": "assistant", "content": r["a1"]},
        {"role": "user", "content": CHAT["q2"]},
        {"role": "assistant", "content": r["a2"]},
    ]
    assert r["messages"] == msgs
    # Upstream's ChatML template renders the conversation exactly as the model's own chat template.
    assert r["text"] == tok.apply_chat_template(msgs, tokenize=False)
    for answer, history in ((r["a1"], msgs[:2]), (r["a2"], msgs[:4])):
        ours = oai.chat.completions.create(model="default", messages=history, max_tokens=CHAT_MAX, temperature=0)
        assert answer.strip() and answer == ours.choices[0].message.content


def test_frontend_fork(frontend, base_url):
    r = frontend_result(frontend, "fork")
    params = {"temperature": 0, "max_new_tokens": FORK_MAX, "stop": "\n"}
    ours = generate(base_url, text=[FORK_PREFIX + s for s in FORK_SUFFIXES], sampling_params=params)
    assert r["text"] == FORK_PREFIX + "".join(o["text"] + "\n" for o in ours)
    assert all(o["text"].strip() for o in ours)


# ---------------------------------------------------------------- few-shot GSM8K runner
GSM8K = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have now?", "3 + 4 = 7\n#### 7"),
    ("A box holds 6 eggs. How many eggs are in 2 boxes?", "6 * 2 = 12\n#### 12"),
    ("Sara had 10 pencils and gave away 3. How many pencils does she have left?", "10 - 3 = 7\n#### 7"),
    ("A train travels 20 miles each hour. How far does it travel in 3 hours?", "20 * 3 = 60\n#### 60"),
]
GSM8K_MAX_NEW = 32
GSM8K_STOPS = ["Question", "Assistant:", "<|separator|>"]  # what the runner's program stops at


def last_int(s: str):
    """GSM8K's grading rule: the last integer in the text (commas dropped)."""
    nums = re.findall(r"\d+", s.replace(",", ""))
    return int(nums[-1]) if nums else None


def test_few_shot_gsm8k(clients, base_url, tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in GSM8K))
    host, port = base_url.rsplit(":", 1)
    proc = clients.run(
        [
            "-m",
            "sglang.test.few_shot_gsm8k",
            "--data-path",
            str(data),
            "--num-questions",
            str(len(GSM8K)),
            "--num-shots",
            "2",
            "--max-new-tokens",
            str(GSM8K_MAX_NEW),
            "--parallel",
            "4",
            "--host",
            host,
            "--port",
            port,
        ],
        cwd=str(tmp_path),
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"few_shot_gsm8k failed{tail(proc)}"
    acc = re.search(r"^Accuracy: ([0-9.]+)$", proc.stdout, re.M)
    invalid = re.search(r"^Invalid: ([0-9.]+)$", proc.stdout, re.M)
    speed = re.search(r"^Output throughput: ([0-9.]+) token/s$", proc.stdout, re.M)
    assert acc and invalid and speed, tail(proc)
    assert float(speed.group(1)) > 0  # from the completion_tokens of every answer's meta_info
    # The runner dumps every final state; each must hold its question followed by an answer.
    dump = (tmp_path / "tmp_output_gsm8k.txt").read_text()
    states = re.findall(r"^={40} (\d+) ={40}\n(.*?)\n={80}\n", dump, re.S | re.M)
    assert [int(i) for i, _ in states] == list(range(len(GSM8K))), dump[-2000:]
    prompts, answers = [], []
    for (q, _), (_, text) in zip(GSM8K, states):
        head = f"Question: {q}\nAnswer:"
        at = text.rfind(head)  # the last one: the first questions are also the few-shot examples
        assert at >= 0, f"question missing from its state: {text[-500:]!r}"
        cut = at + len(head)
        prompts.append(text[:cut])
        answers.append(text[cut:])
    assert all(a.strip() for a in answers), answers
    ours = generate(
        base_url, text=prompts, sampling_params={"temperature": 0, "max_new_tokens": GSM8K_MAX_NEW, "stop": GSM8K_STOPS}
    )
    assert answers == [o["text"] for o in ours]
    # The printed accuracy is what these answers give (last number vs the label after ####).
    expected_acc = sum(last_int(a) == last_int(gold) for a, (_, gold) in zip(answers, GSM8K)) / len(GSM8K)
    assert float(acc.group(1)) == pytest.approx(expected_acc, abs=1e-3)


# ---------------------------------------------------------------- the openai client
CHAT_MSGS = [{"role": "user", "content": "Name a fruit that is yellow."}]
LP_STEPS, TOP_N = 6, 3


def _approx_top(got: Dict[str, float], want: List[Tuple[int, float]], tok) -> None:
    want_d = {tok.decode([i]): v for i, v in want}
    assert len(want_d) == len(want), f"two top tokens decode alike, pick another prompt: {want}"
    assert set(got) == set(want_d), (got, want_d)
    for t, v in want_d.items():
        assert abs(got[t] - v) < LOGPROB_ATOL, (t, got[t], v)


def test_openai_chat_top_logprobs(oai, tok, hf):
    resp = oai.chat.completions.create(
        model="default", messages=CHAT_MSGS, max_tokens=LP_STEPS, temperature=0, logprobs=True, top_logprobs=TOP_N
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens >= 2
    prompt = tok.encode(
        tok.apply_chat_template(CHAT_MSGS, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    assert resp.usage.prompt_tokens == len(prompt)
    ref = hf_greedy_top(hf, prompt, len(content), TOP_N)
    for entry, want in zip(content, ref):
        assert len(entry.top_logprobs) == TOP_N, entry
        assert entry.token == tok.decode([want[0][0]]) == entry.top_logprobs[0].token
        assert abs(entry.logprob - want[0][1]) < LOGPROB_ATOL
        _approx_top({t.token: t.logprob for t in entry.top_logprobs}, want, tok)
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)


def test_openai_completions_logprobs_n(oai, tok, hf):
    prompt = "The largest planet in our solar system is"
    resp = oai.completions.create(
        model="default",
        prompt=prompt,
        max_tokens=LP_STEPS,
        temperature=0,
        logprobs=TOP_N,
        extra_body={"ignore_eos": True},
    )
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == LP_STEPS
    ref = hf_greedy_top(hf, tok.encode(prompt, add_special_tokens=False), LP_STEPS, TOP_N)
    for token, token_lp, top, want in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, ref):
        assert token == tok.decode([want[0][0]]) and abs(token_lp - want[0][1]) < LOGPROB_ATOL
        assert len(top) == TOP_N, top
        _approx_top(top, want, tok)
    assert resp.choices[0].text == "".join(lp.tokens)


def test_openai_n2(oai):
    prompt = "Once upon a time, in a small village,"
    one = oai.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0)
    two = oai.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0, n=2)
    assert sorted(c.index for c in two.choices) == [0, 1]
    assert [c.text for c in two.choices] == [one.choices[0].text] * 2  # greedy: both samples alike
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens
    assert two.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt is counted once
    one = oai.chat.completions.create(model="default", messages=CHAT_MSGS, max_tokens=8, temperature=0)
    two = oai.chat.completions.create(model="default", messages=CHAT_MSGS, max_tokens=8, temperature=0, n=2)
    assert sorted(c.index for c in two.choices) == [0, 1]
    assert [c.message.content for c in two.choices] == [one.choices[0].message.content] * 2
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens
    # Sampled: two valid, independent answers of the requested length.
    two = oai.completions.create(
        model="default", prompt=prompt, max_tokens=8, temperature=1.0, n=2, extra_body={"ignore_eos": True}
    )
    assert len(two.choices) == 2 and two.usage.completion_tokens == 16


def test_openai_models_retrieve(oai):
    listed = oai.models.list().data
    assert listed
    assert oai.models.retrieve(listed[0].id).id == listed[0].id


def test_upstream_version(clients):
    proc = clients.run(["-c", "import sglang; print(sglang.__version__, sglang.__file__)"], cwd="/", timeout=120)
    assert proc.returncode == 0, tail(proc)
    version, path = proc.stdout.split()
    assert version == UPSTREAM_VERSION and Path(path).is_relative_to(clients.venv)
