"""Prometheus metrics of one server (own registry, so several engines can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sglang.srt.managers.io_struct import SchedulerStats

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class TokenizerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.labels = {"model_name": model_name}
        self.num_running = Gauge("sglang:num_running_reqs", "Requests in the running batch", labels, registry=r)
        self.num_queued = Gauge("sglang:num_queue_reqs", "Requests waiting to be scheduled", labels, registry=r)
        self.token_usage = Gauge("sglang:token_usage", "Fraction of KV slots in use", labels, registry=r)
        self.num_used_tokens = Gauge("sglang:num_used_tokens", "KV slots in use", labels, registry=r)
        self.max_total_tokens = Gauge("sglang:max_total_num_tokens", "KV pool size in tokens", labels, registry=r)
        self.gen_throughput = Gauge("sglang:gen_throughput", "Generated tokens per second", labels, registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens of finished requests", labels, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Generated tokens of finished requests", labels, registry=r)
        self.cached_tokens = Gauge("sglang:cached_tokens_total", "Prompt tokens served from the radix cache", labels, registry=r)
        self.num_requests = Counter("sglang:num_requests", "Finished requests", labels, registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token", labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency", labels, buckets=_LATENCY_BUCKETS, registry=r)

    def observe_scheduler(self, s: SchedulerStats) -> None:
        lab = self.labels
        self.num_running.labels(**lab).set(s.num_running_reqs)
        self.num_queued.labels(**lab).set(s.num_queued_reqs)
        self.token_usage.labels(**lab).set(s.token_usage)
        self.num_used_tokens.labels(**lab).set(s.num_used_tokens)
        self.max_total_tokens.labels(**lab).set(s.max_total_num_tokens)
        self.gen_throughput.labels(**lab).set(s.gen_throughput)
        self.cached_tokens.labels(**lab).set(s.cached_tokens_total)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.labels(**self.labels).observe(seconds)

    def observe_finished(self, seconds: float, prompt_tokens: int, completion_tokens: int) -> None:
        self.e2e.labels(**self.labels).observe(seconds)
        self.prompt_tokens.labels(**self.labels).inc(prompt_tokens)
        self.generation_tokens.labels(**self.labels).inc(completion_tokens)
        self.num_requests.labels(**self.labels).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
