from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=4, suite="per-commit-cpu")

# ServerArgs and the resolve step (configs/engine_config.py): bad flags fail at start-up with a message
# naming the flag (both the dataclass + resolve and the CLI, which exits with argparse's code 2), GPU-tier
# defaults, and the default mem_fraction_static formula (DESIGN.md 3.1) on injected device capacities,
# checked against hand-computed numbers.

import pytest

from sglang.srt.configs.device_config import described_device
from sglang.srt.configs.engine_config import EngineConfig, prepare_engine_config, resolve_engine_config
from sglang.srt.model_executor import pool_configurator as planner
from sglang.srt.server_args import ServerArgs, ServerArgsError
from sglang.srt.utils import memory as memory_utils


def resolve(**kwargs) -> EngineConfig:
    return resolve_engine_config(ServerArgs(**kwargs))


SMOL = "SmolLM2-135M-Instruct"

BAD_ARGS = [
    (dict(page_size=-1), "--page-size"),
    (dict(page_size=0), "--page-size"),
    (dict(max_total_tokens=-16), "--max-total-tokens"),
    (dict(max_total_tokens=0), "--max-total-tokens"),
    (dict(max_running_requests=-1), "--max-running-requests"),
    (dict(max_prefill_tokens=-1), "--max-prefill-tokens"),
    (dict(chunked_prefill_size=0), "--chunked-prefill-size"),
    (dict(chunked_prefill_size=-7), "--chunked-prefill-size"),
    (dict(mem_fraction_static=1.5), "--mem-fraction-static"),
    (dict(mem_fraction_static=0.0), "--mem-fraction-static"),
    (dict(mem_fraction_static=-0.2), "--mem-fraction-static"),
    (dict(tp_size=0), "--tp-size"),
    (dict(dp_size=2), "--dp-size"),
    (dict(context_length=-5), "--context-length"),
    (dict(cuda_graph_max_bs=-8), "--cuda-graph-max-bs"),
    (dict(cuda_graph_bs=[1, 0, 4]), "--cuda-graph-bs"),
    (dict(stream_interval=0), "--stream-interval"),
    (dict(port=0), "--port"),
    (dict(port=70000), "--port"),
    (dict(load_format="pickle"), "--load-format"),
    (dict(dtype="float8"), "--dtype"),
    (dict(kv_cache_dtype="int3"), "--kv-cache-dtype"),
    (dict(quantization="awq"), "--quantization"),
    (dict(device="tpu"), "--device"),
    (dict(attention_backend="flashinfer"), "--attention-backend"),
    (dict(device="cpu", attention_backend="triton"), "--attention-backend"),
    (dict(schedule_policy="random"), "--schedule-policy"),
    (dict(grammar_backend="outlines"), "--grammar-backend"),
    (dict(kt_method="FP4"), "--kt-method"),
    (dict(kt_num_gpu_experts=-1), "--kt-num-gpu-experts"),
    (dict(swa_full_tokens_ratio=0.0), "--swa-full-tokens-ratio"),
    (dict(swa_full_tokens_ratio=1.5), "--swa-full-tokens-ratio"),
    (dict(nnodes=2), "--dist-init-addr"),
    (dict(nnodes=2, node_rank=2, dist_init_addr="127.0.0.1:5000"), "--node-rank"),
    (dict(model_path="/no/such/model"), "--model-path"),
]


@pytest.mark.parametrize("kwargs,flag", BAD_ARGS, ids=[f for _, f in BAD_ARGS])
def test_bad_server_args_name_the_flag(kwargs, flag):
    kwargs = {"model_path": SMOL, "device": "cpu", **kwargs}
    if kwargs.get("device") == "tpu":
        kwargs.pop("model_path")
    with pytest.raises(ServerArgsError) as e:
        resolve(**kwargs)
    assert flag in str(e.value)


def test_building_server_args_touches_nothing(monkeypatch):
    """Parsing and validation only: no device, disk or driver (those are the resolve step's)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("ServerArgs probed the device"))
    monkeypatch.setattr(memory_utils, "get_device_memory_capacity", lambda *a: pytest.fail("read device memory"))
    sa = ServerArgs(model_path="/no/such/model", kt_num_gpu_experts=4, kt_cpuinfer=10**6)
    assert sa.model_path == "/no/such/model" and sa.device is None and sa.mem_fraction_static is None


def test_model_path_errors_name_the_flag(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ServerArgsError, match="--model-path"):
        resolve(model_path=str(tmp_path / "weights.bin"), device="cpu")  # a file, not a .gguf
    with pytest.raises(ServerArgsError, match="--model-path"):
        resolve(model_path=str(tmp_path), device="cpu")  # a directory without config.json
    import json

    from sglang.test.gpu_utils import shape_config_dir

    with open(f"{shape_config_dir('Llama-1B-random', root=str(tmp_path / 'shape'))}/config.json") as f:
        (tmp_path / "config.json").write_text(f.read())
    with pytest.raises(ServerArgsError, match="--model-path"):
        resolve(model_path=str(tmp_path), device="cpu")  # config but no safetensors
    # ... which is fine with random weights.
    assert resolve(model_path=str(tmp_path), device="cpu", load_format="dummy").args.load_format == "dummy"
    assert json.loads((tmp_path / "config.json").read_text())["architectures"]


def test_quantization_is_refused_where_it_cannot_apply(tmp_path, capsys):
    import json

    from sglang.srt.configs.model_config import ModelConfig, load_hf_config
    from sglang.srt.model_loader.model_source import resolve_model_source
    from sglang.test.gpu_utils import shape_config_dir

    qwen_moe = shape_config_dir("Qwen3-30B-A3B", root=str(tmp_path))
    with pytest.raises(ServerArgsError, match="--quantization fp8 quantizes dense models"):
        resolve(model_path=qwen_moe, device="cpu", load_format="dummy", quantization="fp8")
    with pytest.raises(SystemExit) as e:  # the CLI: argparse's exit 2 with the same message
        prepare_engine_config(
            ["--device", "cpu", "--model-path", qwen_moe, "--load-format", "dummy", "--quantization", "fp8"]
        )
    assert e.value.code == 2 and "--quantization fp8 quantizes dense models" in capsys.readouterr().err
    llama = shape_config_dir("Llama-1B-random", root=str(tmp_path))
    with open(f"{llama}/config.json") as f:
        config = json.load(f)
    prequantized = tmp_path / "prequantized"
    prequantized.mkdir()
    (prequantized / "config.json").write_text(
        json.dumps({**config, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    )
    with pytest.raises(ServerArgsError, match="--quantization fp8: the checkpoint is already quantized"):
        resolve(model_path=str(prequantized), device="cpu", load_format="dummy", quantization="fp8")
    # ModelConfig, built without ServerArgs (benchmarks, tests), makes the same checks.
    with pytest.raises(ValueError, match="--quantization fp8: the checkpoint is already quantized"):
        ModelConfig.from_hf_config(load_hf_config(resolve_model_source(str(prequantized), "dummy")), quantization="fp8")
    hf_config = resolve(model_path=llama, device="cpu", load_format="dummy").model.hf_config
    with pytest.raises(ValueError, match="--quantization fp8 on the GPU needs --dtype bfloat16"):
        ModelConfig.from_hf_config(hf_config, dtype="float16", device="cuda", quantization="fp8")
    ok = ModelConfig.from_hf_config(hf_config, dtype="bfloat16", device="cuda", quantization="fp8")
    assert ok.quantization == "fp8"


CLI_BAD = [
    (["--page-size", "-1"], "--page-size"),
    (["--max-total-tokens", "-3"], "--max-total-tokens"),
    (["--mem-fraction-static", "2"], "--mem-fraction-static"),
    (["--chunked-prefill-size", "0"], "--chunked-prefill-size"),
    (["--load-format", "pickle"], "--load-format"),  # argparse's own choices check
    (["--quantization", "int4"], "--quantization"),
    (["--model-path", "/no/such/model"], "--model-path"),
    (["--port", "0"], "--port"),
    (["--tp-size", "0"], "--tp-size"),
    (["--dp", "4"], "--dp-size 4"),  # replicas are sglang-router's job here
    (["--dp", "abc"], "--dp-size"),
    (["--log-requests=1"], "--log-requests"),  # switches take no value
    (["--skip-server-warmup=yes"], "--skip-server-warmup"),
    (["--enable-metrics=true"], "--enable-metrics"),
    (["--max-running-requests", "abc"], "--max-running-requests"),
    (["--kt-method", "LLAMAFILE"], "--kt-method"),  # not a format the CPU expert backend reads
    (["--kt-cpuinfer", "100000"], "--kt-cpuinfer"),
    (["--kt-threadpool-count", "2"], "--kt-threadpool-count"),
    (["--kt-max-deferred-experts-per-token", "2"], "--kt-max-deferred-experts-per-token"),
    (["--kt-num-gpu-experts", "4"], "--kt-num-gpu-experts"),  # the default model has no experts
    (["--disable-overlap-schedule=1"], "--disable-overlap-schedule"),  # switches take no value
    (["--enable-mixed-chunk=yes"], "--enable-mixed-chunk"),
    (["--grammar-backend", "outlines"], "--grammar-backend"),  # argparse lists the names
    (["--swa-full-tokens-ratio", "2"], "--swa-full-tokens-ratio"),
]


@pytest.mark.parametrize("argv,flag", CLI_BAD, ids=[f for _, f in CLI_BAD])
def test_cli_bad_args_exit_2_and_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        prepare_engine_config(["--device", "cpu", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err
    assert "usage:" in err


def test_llguidance_backend_needs_its_package(monkeypatch, capsys):
    """Accepted where `llguidance` is installed (the project's env); a CLI error naming the flag where not."""
    import importlib.util

    assert prepare_engine_config(["--device", "cpu", "--grammar-backend", "llguidance"]).args.grammar_backend == (
        "llguidance"
    )
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llguidance" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        prepare_engine_config(["--device", "cpu", "--grammar-backend", "llguidance"])
    assert e.value.code == 2 and "--grammar-backend llguidance needs the llguidance package" in capsys.readouterr().err


def test_cli_kt_num_gpu_experts_within_the_models_experts(tmp_path, capsys):
    from sglang.test.gpu_utils import shape_config_dir

    qwen = shape_config_dir("Qwen3-30B-A3B", root=str(tmp_path))
    base = ["--device", "cpu", "--model-path", qwen, "--load-format", "dummy"]
    with pytest.raises(SystemExit) as e:
        prepare_engine_config([*base, "--kt-num-gpu-experts", "129"])
    assert e.value.code == 2 and "--kt-num-gpu-experts 129 must be in [0, 128]" in capsys.readouterr().err
    for ok in ("0", "128"):
        assert prepare_engine_config([*base, "--kt-num-gpu-experts", ok]).kt.num_gpu_experts == int(ok)


def test_cli_kt_flags_without_kt_are_refused_by_name(tmp_path, capsys):
    """--kt-method or --kt-cpuinfer alone would leave every expert on the GPU: refused, naming the flag and the flags
    that turn KT on. With KT on, the method defaults to AMXINT4, resolved in the flags /server_info shows."""
    from sglang.test.gpu_utils import shape_config_dir

    qwen = shape_config_dir("Qwen3-30B-A3B", root=str(tmp_path))
    base = ["--device", "cpu", "--model-path", qwen, "--load-format", "dummy"]
    for flags in (["--kt-method", "BF16"], ["--kt-cpuinfer", "1"]):
        with pytest.raises(SystemExit) as e:
            prepare_engine_config([*base, *flags])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"{flags[0]} does nothing while KT is off" in err and "--kt-num-gpu-experts" in err
    config = prepare_engine_config(base)
    assert config.kt is None and config.args.kt_method is None
    config = prepare_engine_config([*base, "--kt-num-gpu-experts", "4", "--kt-cpuinfer", "1"])
    assert config.kt.method == config.args.kt_method == "AMXINT4" and config.kt.cpu_threads == 1
    config = prepare_engine_config([*base, "--kt-num-gpu-experts", "4", "--kt-method", "bf16"])
    assert config.kt.method == config.args.kt_method == "BF16"


def test_cli_good_args_parse():
    sa = prepare_engine_config(
        [
            "--device",
            "cpu",
            "--model-path",
            SMOL,
            "--page-size",
            "4",
            "--max-total-tokens",
            "1024",
            "--chunked-prefill-size",
            "64",
            "--disable-radix-cache",
            "--mem-fraction-static",
            "0.5",
            "--disable-overlap-schedule",
            "--swa-full-tokens-ratio",
            "0.25",
            "--disable-hybrid-swa-memory",
        ]
    ).args
    assert (sa.page_size, sa.max_total_tokens, sa.chunked_prefill_size) == (4, 1024, 64)
    assert sa.disable_radix_cache and sa.mem_fraction_static == 0.5
    assert sa.disable_overlap_schedule
    assert sa.swa_full_tokens_ratio == 0.25 and sa.disable_hybrid_swa_memory
    assert not prepare_engine_config(["--device", "cpu", "--model-path", SMOL]).args.disable_overlap_schedule  # default
    assert sa.disable_cuda_graph and sa.attention_backend == "torch_native"


# ------------------------------------------------------------------ memory heuristics
@pytest.fixture
def capacity(monkeypatch):
    """Inject the device's total memory (MiB) the resolve step reads."""

    def set_capacity(mib):
        monkeypatch.setattr(memory_utils, "get_device_memory_capacity", lambda device, index=0: float(mib))

    return set_capacity


# (total MiB, tp, extra flags) -> (chunked_prefill_size, cuda_graph_max_bs, mem_fraction_static), by hand:
#   reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + graph_bs * 2, floored at 10240 above 60 GiB
#   fraction = round((total - reserved) / total, 3)
MEM_CASES = [
    # 16 GiB (T4-class): tier <20 GiB -> 2048, 8. reserved = 512 + 3072 + 128 + 16 = 3728.
    (16384, 1, {}, 2048, 8, 0.772),  # 12656 / 16384 = 0.77246
    # RTX 4090 (24564 MiB): tier <35 GiB -> 4096, 48. reserved = 512 + 6144 + 128 + 96 = 6880.
    (24564, 1, {}, 4096, 48, 0.720),  # 17684 / 24564 = 0.71992
    # Same card, TP 4: graph bs 160. reserved = 512 + 6144 + 512 + 320 = 7488.
    (24564, 4, {}, 4096, 160, 0.695),  # 17076 / 24564 = 0.69516
    # A 48 GiB card (49140 MiB): tier <60 GiB -> 4096, 32. reserved = 512 + 6144 + 128 + 64 = 6848.
    (49140, 1, {}, 4096, 32, 0.861),  # 42292 / 49140 = 0.86064
    # H100 80 GB (81559 MiB): tier <90 GiB -> 8192, 256. reserved = 512 + 12288 + 128 + 512 = 13440.
    (81559, 1, {}, 8192, 256, 0.835),  # 68119 / 81559 = 0.83521
    # H100, TP 8: graph bs 512. reserved = 512 + 12288 + 1024 + 1024 = 14848.
    (81559, 8, {}, 8192, 512, 0.818),  # 66711 / 81559 = 0.81795
    # 64 GiB with a small chunk: 512 + 3072 + 128 + 512 = 4224 < 10240 floor (> 60 GiB).
    (65536, 1, {"chunked_prefill_size": 2048}, 2048, 256, 0.844),  # 55296 / 65536 = 0.84375
    # H200 (143771 MiB): tier <160 GiB -> 8192, 256. reserved = 13440.
    (143771, 1, {}, 8192, 256, 0.907),  # 130331 / 143771 = 0.90652
    # 192 GiB (196608 MiB): tier >=160 GiB -> 16384, 512. reserved = 512 + 24576 + 128 + 1024 = 26240.
    (196608, 1, {}, 16384, 512, 0.867),  # 170368 / 196608 = 0.86654
    # A user chunk raises the activation term: 24564 MiB, chunk 8192: 512 + 12288 + 128 + 96 = 13024.
    (24564, 1, {"chunked_prefill_size": 8192}, 8192, 48, 0.470),  # 11540 / 24564 = 0.46979
]


def _expected_fraction(total, tp, chunk, graph_bs, max_prefill=16384):
    act = max(chunk if chunk > 0 else max_prefill, 2048)
    reserved = 512 + act * 1.5 + tp / 8 * 1024 + graph_bs * 2
    if total > 60 * 1024:
        reserved = max(reserved, 10240)
    return round((total - reserved) / total, 3)


@pytest.mark.parametrize("total,tp,extra,chunk,graph_bs,fraction", MEM_CASES)
def test_default_mem_fraction_static(capacity, total, tp, extra, chunk, graph_bs, fraction):
    capacity(total)
    config = resolve(model_path=SMOL, device="cpu", tp_size=tp, **extra)
    sa = config.args
    assert sa.chunked_prefill_size == chunk
    assert sa.cuda_graph_max_bs == graph_bs
    assert sa.mem_fraction_static == fraction  # the hand-computed number in the table
    assert sa.mem_fraction_static == _expected_fraction(total, tp, chunk, graph_bs)
    assert not config.memory.post_capture and config.memory.pool.static_mem_fraction_static == fraction


def test_chunking_off_uses_max_prefill_tokens(capacity):
    capacity(81559)
    sa = resolve(model_path=SMOL, device="cpu", chunked_prefill_size=-1).args
    # 512 + 16384 * 1.5 + 128 + 512 = 25728 -> (81559 - 25728) / 81559 = 0.68454
    assert planner.static_reserved_mem_mb(planner.ReserveInputs(81559, -1, 16384, 1, 1, 256)) == 25728
    assert sa.mem_fraction_static == 0.685


def test_explicit_mem_fraction_is_kept(capacity):
    capacity(81559)
    assert resolve(model_path=SMOL, device="cpu", mem_fraction_static=0.42).args.mem_fraction_static == 0.42


def test_reserve_terms_and_post_capture_reserve(capacity):
    capacity(81559)
    config = resolve(model_path=SMOL, device="cpu", tp_size=2)
    r = planner.ReserveInputs(81559, config.args.chunked_prefill_size, 16384, 2, 1, config.args.cuda_graph_max_bs)
    assert planner.reserve_for_graph_mb(r) == 512 and config.memory.graph_reserve_bytes == 512 << 20
    assert r.activation_tokens == 8192
    assert planner.pre_capture_activation_reserve_mb(r) == 512 + 12288 + 256
    assert config.memory.pool.activation_reserve_bytes == (512 + 12288 + 256) << 20
    assert planner.static_reserved_mem_mb(r) == 512 + 12288 + 256 + 512
    assert planner.post_capture_reserved_mem_mb(r) == 1536 + 256
    # The CPU never plans post-capture sizing, and says why.
    assert not config.memory.post_capture
    assert "device is not CUDA" in config.memory.path.reason


def test_tiny_device_cannot_get_a_default_fraction(capacity):
    capacity(2048)  # 2 GiB: reserved 3728 MiB exceeds it
    with pytest.raises(ServerArgsError, match="--mem-fraction-static"):
        resolve(model_path=SMOL, device="cpu")


# ------------------------------------------------------------------ the sizing path, decided once
H200 = 143771.0  # MiB, as nvidia-smi reports it


def _h200(flag: bool, vmm_problem=None, **kw) -> EngineConfig:
    device = described_device("cuda", H200, vmm_problem)
    return resolve_engine_config(ServerArgs(model_path=SMOL, **kw), device=device, post_capture=flag)


def test_the_env_flag_is_read_by_the_resolve_step():
    """SGLANG_ENABLE_POST_CAPTURE_KV_SIZING (SGLang's interface) decides the path when the caller does not."""
    from sglang.srt.environ import envs

    device = described_device("cuda", H200)
    for flag in (False, True):
        with envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.override(flag):
            assert resolve_engine_config(ServerArgs(model_path=SMOL), device=device).memory.post_capture == flag


def test_path_decides_the_default_fraction():
    off, on = _h200(False), _h200(True)
    # H200 tier: chunk 8192, graph bs 256 -> static reserve 512 + 12288 + 128 + 512 = 13440 MiB.
    assert off.args.chunked_prefill_size == 8192 and off.args.cuda_graph_max_bs == 256
    assert not off.memory.post_capture
    assert off.memory.path.reason == "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is off"
    assert off.args.mem_fraction_static == round((H200 - 13440) / H200, 3) == 0.907
    # Planned: 1536 + tp*pp/8*1024 = 1664 MiB, no activation or graph guess.
    assert on.memory.post_capture and on.memory.path.name == "post-capture"
    assert on.args.mem_fraction_static == on.memory.pool.mem_fraction_static == round((H200 - 1664) / H200, 3) == 0.988
    assert on.memory.pool.static_mem_fraction_static == off.args.mem_fraction_static
    assert on.memory.pool.activation_reserve_bytes == int(max(512 + 8192 * 1.5 + 128, 10240) * (1 << 20))


@pytest.mark.parametrize(
    "kw,reason",
    [
        (dict(disable_cuda_graph=True), "decode CUDA graphs are disabled"),
        (dict(chunked_prefill_size=-1), "chunked prefill is disabled"),
        (dict(attention_backend="torch_native"), "the torch_native attention backend has no CUDA graphs"),
    ],
)
def test_blocked_post_capture_keeps_the_static_default(kw, reason):
    config = _h200(True, **kw)
    assert not config.memory.post_capture and reason in config.memory.path.reason
    assert config.args.mem_fraction_static == config.memory.pool.static_mem_fraction_static


def test_missing_vmm_decides_static_before_the_default_fraction(caplog):
    config = _h200(True, vmm_problem="cuda-bindings is not installed")
    assert not config.memory.post_capture
    assert config.memory.path.reason == "CUDA VMM unavailable: cuda-bindings is not installed"
    assert config.args.mem_fraction_static == _h200(False).args.mem_fraction_static == 0.907  # not post-capture's
    assert any("using static sizing" in r.message for r in caplog.records)


def test_the_decision_travels_with_the_config():
    """Scheduler processes get the pickled configuration: they never decide again (nor probe the driver)."""
    import pickle

    config = _h200(True)
    again = pickle.loads(pickle.dumps(config))
    assert again == config and again.memory.post_capture and again.device.memory_mib == H200


def test_server_info_shows_flags_only():
    out = _h200(True).args.to_public_dict()
    assert set(out) == {f.name for f in __import__("dataclasses").fields(ServerArgs)}
    assert out["mem_fraction_static"] == 0.988 and out["cuda_graph_max_bs"] == 256 and out["device"] == "cuda"


def test_cli_module_imports_nothing_of_ours():
    """server_args imports server_args_cli, never the other way round."""
    import ast
    import inspect

    from sglang.srt import server_args_cli

    tree = ast.parse(inspect.getsource(server_args_cli))
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if m and m.startswith("sglang")], modules
