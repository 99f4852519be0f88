"""python -m sglang.plan_memory for sliding-window models (scripts/make_model_configs.py's Gemma-3-27B and
Gemma-2-9B shapes): on the static path the windowed layers get their own pool of --swa-full-tokens-ratio x the full
pool's tokens, the cell size counts that share of their bytes (hand counts below), and the plan names both pools;
the post-capture path the same (its windowed layers' ranges backed for the window pool); --disable-hybrid-swa-memory
keeps one pool for every layer."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="per-commit-cpu")

import math

import pytest

from sglang.plan_memory import main, parse_args, plan_path
from sglang.srt.model_executor.pool_configurator import GiB
from sglang.test.gpu_utils import shape_config_dir

# Gemma-3-27B: 62 layers, every sixth full (10), 16 KV heads of 128; Gemma-2-9B: 42 alternating, 8 KV heads of 256.
SHAPES = {"Gemma-3-27B": (10, 52, 16 * 128 * 2 * 2), "Gemma-2-9B": (21, 21, 8 * 256 * 2 * 2)}


@pytest.fixture(scope="module")
def config_dirs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("shapes"))
    return {name: shape_config_dir(name, root=root) for name in SHAPES}


def _plans(argv):
    ns, assumed = parse_args(argv)
    return plan_path(ns, assumed, post_capture=False), plan_path(ns, assumed, post_capture=True)


def _static_tokens(plan) -> int:
    rest = plan.available_after_weights_gb - plan.pre_model_load_memory_gb * (1 - plan.mem_fraction_static)
    return int(rest * GiB) // plan.cell_size_bytes


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("ratio", [0.8, 0.25])
def test_window_layers_count_their_share_of_the_cell(config_dirs, name, ratio):
    full_layers, window_layers, layer_cell = SHAPES[name]
    static, post = _plans(["--model-path", config_dirs[name], "--swa-full-tokens-ratio", str(ratio)])
    assert static.swa_layers == window_layers
    assert static.cell_size_bytes == full_layers * layer_cell + math.ceil(window_layers * layer_cell * ratio)
    assert static.max_total_num_tokens == _static_tokens(static)
    assert static.swa_max_total_num_tokens == int(static.max_total_num_tokens * ratio)
    # Both pools' bytes fit what the cell size counted for the full pool's tokens.
    pools = (static.max_total_num_tokens * full_layers + static.swa_max_total_num_tokens * window_layers) * layer_cell
    assert pools <= static.max_total_num_tokens * static.cell_size_bytes
    one_pool, post_one_pool = _plans(["--model-path", config_dirs[name], "--disable-hybrid-swa-memory"])
    assert one_pool.swa_layers == 0 and one_pool.cell_size_bytes == (full_layers + window_layers) * layer_cell
    assert static.max_total_num_tokens > one_pool.max_total_num_tokens
    # Post-capture: the same two pools over VMM ranges (the rounding to granules is test_pool_configurator's).
    assert post.swa_layers == window_layers and post.cell_size_bytes == static.cell_size_bytes
    assert post.swa_max_total_num_tokens == int(post.max_total_num_tokens * ratio)
    assert post.max_total_num_tokens > post_one_pool.max_total_num_tokens


def test_the_plan_names_the_window_pool(config_dirs, capsys):
    assert main(["--model-path", config_dirs["Gemma-3-27B"]]) == 0
    out = capsys.readouterr().out
    static, post = out.split("[post-capture]")
    assert "sliding-window layers | 52 in their own pool of" in static
    assert "sliding-window layers  | 52 in their own pool of" in post
