"""The server's Prometheus metrics (``GET /metrics``), through ``prometheus_client``.

The front end counts what passes through it: requests by endpoint and finish reason,
prompt, generated and reasoning tokens, refused requests by HTTP status, and each
request's time. The engine's own state comes from a health round trip made when the
metrics are scraped: requests running and waiting, steps, grammar compiles (count and
seconds, as a summary), compiled-grammar cache hits, and bitmask fills (steps that
filled, rows, and seconds, as a summary: its mean is the fill time per step).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from ipc import HealthReply

from .protocol import Usage

#: the content type of ``generate_latest``'s text
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EngineCollector(Collector):
    """The engine's numbers from its last health reply (none while it is gone)."""

    def __init__(self) -> None:
        self.reply: HealthReply | None = None

    def collect(self):
        up = GaugeMetricFamily("thinkgate_engine_up", "1 while the engine answers, else 0")
        up.add_metric([], 1.0 if self.reply is not None else 0.0)
        yield up
        h = self.reply
        if h is None:
            return
        for name, doc, value in (
            ("requests_running", "Requests in the engine's running batch", h.num_running),
            ("requests_waiting", "Requests waiting for a place in the batch", h.num_waiting),
            ("grammars_compiling", "Grammar compiles queued or running", h.num_compiling),
            ("grammar_cache_entries", "Compiled grammars in the cache", h.num_cached_grammars),
        ):
            g = GaugeMetricFamily(f"thinkgate_{name}", doc)
            g.add_metric([], float(value))
            yield g
        for name, doc, value in (
            ("engine_steps", "Engine steps run", h.num_steps),
            (
                "grammar_cache_hits",
                "Grammar submissions answered from the compiled-grammar cache",
                h.num_grammar_cache_hits,
            ),
            ("fill_rows", "Bitmask rows filled", h.num_fill_rows),
        ):
            c = CounterMetricFamily(f"thinkgate_{name}", doc)
            c.add_metric([], float(value))
            yield c
        s = SummaryMetricFamily(
            "thinkgate_grammar_compile_seconds", "Seconds each grammar compile took"
        )
        s.add_metric([], count_value=h.num_compiled_grammars, sum_value=h.compile_seconds)
        yield s
        s = SummaryMetricFamily(
            "thinkgate_fill_seconds",
            "Seconds the bitmask fill took, per engine step that filled rows",
        )
        s.add_metric([], count_value=h.num_fill_steps, sum_value=h.fill_seconds)
        yield s


class Metrics:
    """One server's metrics, in a registry of their own."""

    def __init__(self) -> None:
        disable_created_metrics()  # the *_created series say nothing here
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "thinkgate_requests",
            "Requests that ran, by endpoint and finish reason (error: the engine failed "
            "it; disconnected: the client left first)",
            ["endpoint", "finish_reason"],
            registry=r,
        )
        self.refused = Counter(
            "thinkgate_requests_refused",
            "Requests answered with an error status before they ran, by status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "thinkgate_prompt_tokens", "Prompt tokens of the requests that ran", registry=r
        )
        self.generation_tokens = Counter(
            "thinkgate_generation_tokens", "Tokens generated", registry=r
        )
        self.reasoning_tokens = Counter(
            "thinkgate_reasoning_tokens", "Tokens generated inside the thinking", registry=r
        )
        self.request_seconds = Histogram(
            "thinkgate_request_seconds",
            "Seconds from a request's arrival to its last byte",
            ["endpoint"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self._engine = _EngineCollector()
        r.register(self._engine)

    def finished(
        self, endpoint: str, finish_reason: str, usage: Usage | None, seconds: float
    ) -> None:
        """A request that reached the engine ended."""
        self.requests.labels(endpoint, finish_reason).inc()
        self.request_seconds.labels(endpoint).observe(seconds)
        if usage is not None:
            self.prompt_tokens.inc(usage.prompt_tokens)
            self.generation_tokens.inc(usage.completion_tokens)
            details = usage.completion_tokens_details
            if details is not None:
                self.reasoning_tokens.inc(details.reasoning_tokens)

    def refuse(self, endpoint: str, status: int) -> None:
        self.refused.labels(endpoint, str(status)).inc()

    def render(self, engine: HealthReply | None) -> bytes:
        """The metrics text, with the engine's numbers from ``engine`` (None: gone)."""
        self._engine.reply = engine
        return generate_latest(self.registry)
