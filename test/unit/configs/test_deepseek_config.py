"""DeepSeek-family configs: what we do not run exactly is refused at start-up naming the field (before any
weight loads); a Kimi-K2 config (model_type kimi_k2 + auto_map) loads as DeepSeek-V3 without running the
checkpoint's code, with or without --trust-remote-code; --kt-num-gpu-experts sees DeepSeek's experts."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="per-commit-cpu")

import json
import os

import pytest

from sglang.srt.configs.deepseek import UnsupportedModelError, check_deepseek_config
from sglang.srt.configs.engine_config import prepare_engine_config, resolve_engine_config
from sglang.srt.configs.model_config import ModelConfig, attention_kind, load_hf_config
from sglang.srt.model_loader.model_source import ModelSource
from sglang.srt.server_args import ServerArgs, ServerArgsError
from sglang.test.tiny_deepseek import tiny_deepseek_config


def _write(tmp_path, version: str, **fields) -> str:
    raw = tiny_deepseek_config(version).to_dict()
    raw["architectures"] = [{"v2": "DeepseekV2ForCausalLM", "v3": "DeepseekV3ForCausalLM"}[version]]
    raw.update(fields)
    d = tmp_path / f"{version}-{len(os.listdir(tmp_path))}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    return str(d)


REFUSED = [
    ("v3", dict(topk_method="greedy"), "topk_method='greedy'"),
    ("v3", dict(scoring_func="softmax"), "scoring_func='softmax'"),
    ("v2", dict(topk_method="noaux_tc"), "topk_method='noaux_tc'"),
    ("v2", dict(scoring_func="sigmoid"), "scoring_func='sigmoid'"),
    ("v2", dict(norm_topk_prob=True), "norm_topk_prob"),
    ("v3", dict(index_topk=2048, index_n_heads=64, index_head_dim=128), "index_topk"),
    ("v3", dict(architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32"), "DeepSeek-V3.2"),
    ("v3", dict(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4"), "DeepSeek-V4"),
    ("v3", dict(n_group=3), "n_group=3"),
    ("v3", dict(moe_layer_freq=2), "moe_layer_freq=2"),
]


@pytest.mark.parametrize("version,fields,named", REFUSED, ids=[r[2] for r in REFUSED])
def test_unsupported_fields_are_refused_by_name(tmp_path, version, fields, named):
    d = _write(tmp_path, version, **fields)
    with pytest.raises(UnsupportedModelError, match=named.replace("(", r"\(").replace(".", r"\.")):
        check_deepseek_config(load_hf_config(ModelSource("hf", d)))
    with pytest.raises(UnsupportedModelError, match="|".join(named.split("="))):
        ModelConfig.from_hf_config(load_hf_config(ModelSource("hf", d)))  # what the scheduler builds first
    # At the command line: exit naming the field, no model loaded (the directory has no weights at all).
    with pytest.raises(ServerArgsError, match=named.split("=")[0]):
        resolve_engine_config(ServerArgs(model_path=d, device="cpu", load_format="dummy"))


def test_the_cli_names_the_field(tmp_path, capsys):
    d = _write(tmp_path, "v3", topk_method="group_limited_greedy")
    with pytest.raises(SystemExit):
        prepare_engine_config(["--model-path", d, "--load-format", "dummy", "--device", "cpu"])
    assert "topk_method='group_limited_greedy'" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_what_we_run_is_accepted(tmp_path, version):
    d = _write(tmp_path, version, topk_method="noaux_tc" if version == "v3" else "greedy")
    mc = ModelConfig.from_hf_config(load_hf_config(ModelSource("hf", d)))
    assert mc.is_mla and mc.is_moe and attention_kind(mc.hf_config) == "mla"
    assert (mc.kv_lora_rank, mc.qk_nope_head_dim, mc.qk_rope_head_dim, mc.head_dim, mc.v_head_dim) == (
        32,
        16,
        8,
        24,
        16,
    )
    # --kt-num-gpu-experts reads n_routed_experts (it used to say "not a MoE model").
    args = ServerArgs(model_path=d, device="cpu", load_format="dummy", kt_num_gpu_experts=8)
    assert resolve_engine_config(args).kt.num_gpu_experts == 8
    with pytest.raises(ServerArgsError, match=r"must be in \[0, 8\]"):
        resolve_engine_config(ServerArgs(model_path=d, device="cpu", load_format="dummy", kt_num_gpu_experts=9))


def _kimi_k2_dir(tmp_path) -> tuple[str, str]:
    """A Kimi-K2-style directory: model_type kimi_k2, auto_map to a configuration file that leaves a marker if
    anything ever imports it."""
    raw = tiny_deepseek_config("v3").to_dict()
    raw.update(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="kimi_k2",
        auto_map={
            "AutoConfig": "configuration_deepseek.DeepseekV3Config",
            "AutoModel": "modeling_deepseek.DeepseekV3Model",
            "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
        },
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        num_nextn_predict_layers=1,
    )
    d = tmp_path / "kimi-k2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    marker = tmp_path / "remote-code-ran"
    code = f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('remote code must not run')\n"
    (d / "configuration_deepseek.py").write_text(code)
    (d / "modeling_deepseek.py").write_text(code)
    return str(d), str(marker)


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_kimi_k2_config_loads_as_deepseek_v3_without_remote_code(tmp_path, trust_remote_code):
    from sglang.test.runners import greedy_params, make_scheduler, run_scheduler

    d, marker = _kimi_k2_dir(tmp_path)
    config = load_hf_config(ModelSource("hf", d))
    assert type(config).__name__ == "DeepseekV3Config" and config.n_routed_experts == 8
    sched = make_scheduler(
        reuse_model=False,
        model_path=d,
        load_format="dummy",
        skip_tokenizer_init=True,
        trust_remote_code=trust_remote_code,
        max_total_tokens=256,
        log_level="warning",
    )
    assert type(sched.model_runner.model).__name__ == "DeepseekV3ForCausalLM"
    out = run_scheduler(sched, [[5, 6, 7]], greedy_params(4))[0]
    assert len(out.output_ids) == 4
    assert not os.path.exists(marker)  # nothing of the checkpoint's Python ran
