from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="per-commit-cpu")

# TokenizerMetrics' per-chunk inter-token latency: a chunk of k tokens counts k observations of seconds / k,
# under the model_name label /metrics shows.

from sglang.srt.managers.tokenizer_metrics import TokenizerMetrics


def itl(metrics: TokenizerMetrics, what: str) -> float:
    return metrics.registry.get_sample_value(f"sglang:inter_token_latency_seconds_{what}", metrics.labels) or 0.0


def test_inter_token_latency_counts_every_token_of_a_chunk():
    m = TokenizerMetrics("my-model")
    m.observe_inter_token(0.3, 3)
    m.observe_inter_token(0.05, 1)
    m.observe_inter_token(1.0, 0)  # a chunk without tokens (only a finish reason) is not a latency
    assert itl(m, "count") == 4
    assert abs(itl(m, "sum") - 0.35) < 1e-12
    assert b'inter_token_latency_seconds_count{model_name="my-model"} 4.0' in m.render()
