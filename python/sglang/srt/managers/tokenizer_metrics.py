"""Prometheus metrics of one server, under upstream SGLang's names (prefix `sglang:`, label
`model_name`), so dashboards built for SGLang read them unchanged. Own registry, so several
engines can live in one process.

Counters only ever grow: the scheduler reports running totals (SchedulerStats), and each counter is
advanced by the difference since the last report. Gauges are the scheduler's current state.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sglang.srt.managers.io_struct import SchedulerStats

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5)


class TokenizerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = r = CollectorRegistry()
        self.labels = {"model_name": model_name}
        names = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, names, registry=r)

        def counter(name: str, doc: str) -> Counter:  # prometheus_client appends `_total`
            return Counter(f"sglang:{name}", doc, names, registry=r)

        def histogram(name: str, doc: str, buckets=_LATENCY_BUCKETS) -> Histogram:
            return Histogram(f"sglang:{name}", doc, names, buckets=buckets, registry=r)

        # Scheduler state (gauges)
        self.num_running = gauge("num_running_reqs", "Requests in the running batch")
        self.num_queued = gauge("num_queue_reqs", "Requests waiting to be scheduled")
        self.num_retracted = gauge("num_retracted_reqs", "Waiting requests that were retracted from the running batch")
        self.num_used_tokens = gauge("num_used_tokens", "KV slots in use")
        self.token_usage = gauge("token_usage", "Fraction of KV slots in use")
        self.max_total_tokens = gauge("max_total_num_tokens", "KV pool size in tokens")
        self.swa_token_usage = gauge("swa_token_usage", "Fraction of the sliding-window layers' KV pool in use")
        self.gen_throughput = gauge("gen_throughput", "Generated tokens per second over the last second")
        self.cache_hit_rate = gauge("cache_hit_rate", "Prompt tokens served from the radix cache / prompt tokens")
        # Running totals (counters)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens of finished requests")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the radix cache")
        self.num_requests = counter("num_requests", "Finished requests")
        self.num_aborted = counter("num_aborted_requests", "Requests that ended with an abort (error, client gone)")
        self.num_oom_recoveries = counter(
            "num_oom_recoveries", "Batches aborted after a device out-of-memory error while the server kept serving"
        )
        # Latencies (histograms)
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token")
        self.itl = histogram(
            "inter_token_latency_seconds", "Time between streamed output chunks, per token", _ITL_BUCKETS
        )
        self._itl_child = self.itl.labels(**self.labels)  # observed for every streamed chunk: looked up once
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency")
        self.queue_time = histogram("queue_time_seconds", "Time a request waited before its first prefill")
        self._last = SchedulerStats()

    def observe_scheduler(self, s: SchedulerStats) -> None:
        lab = self.labels
        self.num_running.labels(**lab).set(s.num_running_reqs)
        self.num_queued.labels(**lab).set(s.num_queued_reqs)
        self.num_retracted.labels(**lab).set(s.num_retracted_waiting)
        self.token_usage.labels(**lab).set(s.token_usage)
        self.num_used_tokens.labels(**lab).set(s.num_used_tokens)
        self.max_total_tokens.labels(**lab).set(s.max_total_num_tokens)
        self.swa_token_usage.labels(**lab).set(s.swa_token_usage)
        self.gen_throughput.labels(**lab).set(s.gen_throughput)
        if s.prompt_tokens_total:
            self.cache_hit_rate.labels(**lab).set(s.cached_tokens_total / s.prompt_tokens_total)
        self.cached_tokens.labels(**lab).inc(max(s.cached_tokens_total - self._last.cached_tokens_total, 0))
        self.num_oom_recoveries.labels(**lab).inc(max(s.num_oom_recoveries - self._last.num_oom_recoveries, 0))
        self._last = s

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.labels(**self.labels).observe(seconds)

    def observe_inter_token(self, seconds: float, tokens: int) -> None:
        """A chunk of `tokens` new tokens arrived `seconds` after the previous one."""
        if tokens > 0:
            per_token = seconds / tokens
            for _ in range(tokens):
                self._itl_child.observe(per_token)

    def observe_finished(
        self, seconds: float, prompt_tokens: int, completion_tokens: int, aborted: bool, queue_time: float | None
    ) -> None:
        lab = self.labels
        self.e2e.labels(**lab).observe(seconds)
        self.prompt_tokens.labels(**lab).inc(prompt_tokens)
        self.generation_tokens.labels(**lab).inc(completion_tokens)
        self.num_requests.labels(**lab).inc()
        if aborted:
            self.num_aborted.labels(**lab).inc()
        if queue_time is not None:
            self.queue_time.labels(**lab).observe(queue_time)

    def render(self) -> bytes:
        return generate_latest(self.registry)
