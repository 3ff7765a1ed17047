"""``GET /metrics`` of ``zoo serve``: Prometheus's text format, as vLLM and TGI expose it.

Each application has a registry of its own (:class:`Metrics`), never the process-wide default
one, so several servers in one process keep their own counts. A request is counted and timed
by its served model's :class:`ModelMetrics` (the :class:`~zoo.serve.request.Observer` its
:class:`~zoo.serve.request.Request` tells, from the engine's thread); what the engine holds
now (running and waiting requests, the prefix cache) is read from it at each scrape.

A "request" here is one sequence: a completion with a list of three prompts counts three.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["ITL_BUCKETS", "LATENCY_BUCKETS", "TTFT_BUCKETS", "Metrics", "ModelMetrics"]

#: Time to first token, seconds: from 0.001 (a small model on a GPU) to 60 (a long prompt
#: queued behind a full batch on a CPU).
TTFT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 60.0,
)  # fmt: skip

#: Between two tokens of one sequence, seconds: from 0.001 to 10 (a stall).
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

#: A request from its arrival to its end, seconds: from 0.01 to 1200 (20 minutes).
LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
    120.0, 300.0, 600.0, 1200.0,
)  # fmt: skip

#: How a request ends (:attr:`zoo.serve.request.Finish.reason`): each has a series from the
#: start, at 0, so a rate over it is defined before the first such end.
REASONS = ("stop", "length", "cancelled", "error")


class ModelMetrics:
    """The counters and histograms of one served model name (the base or an adapter): the
    :class:`~zoo.serve.request.Observer` of its requests. A token costs two updates of
    ``prometheus_client`` values (a lock each, no other), cheap enough for every row of a
    step."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._model = model
        self._finished_by = metrics.finished
        self._received = metrics.received.labels(model)
        self._finished = {r: metrics.finished.labels(model, r) for r in REASONS}
        self._prompt_tokens = metrics.prompt_tokens.labels(model)
        self._generation_tokens = metrics.generation_tokens.labels(model)
        self._ttft = metrics.ttft.labels(model)
        self._itl = metrics.itl.labels(model)
        self._latency = metrics.latency.labels(model)

    def received(self, requests: int) -> None:
        self._received.inc(requests)

    def first_token(self, prompt_tokens: int, seconds: float) -> None:
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc()
        self._ttft.observe(seconds)

    def next_token(self, seconds: float) -> None:
        self._generation_tokens.inc()
        self._itl.observe(seconds)

    def finished(self, reason: str, seconds: float) -> None:
        finished = self._finished.get(reason)
        if finished is None:  # a reason not in REASONS gets a series of its own
            finished = self._finished[reason] = self._finished_by.labels(self._model, reason)
        finished.inc()
        self._latency.observe(seconds)


class Metrics:
    """The metrics of one ``zoo serve`` application, in a registry of its own.

    Args:
        engine: the engine whose queue and prefix cache each scrape reads.
        models: the model names requests may give (the base, then each adapter): each gets
            its series at 0 from the start.
    """

    def __init__(self, engine: Engine, models: Iterable[str]) -> None:
        self.registry = CollectorRegistry()
        self.engine = engine
        registry = self.registry

        def counter(name: str, help_text: str, *labels: str) -> Counter:
            return Counter(name, help_text, ("model", *labels), registry=registry)

        def histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_text, ("model",), registry=registry, buckets=buckets)

        self.received = counter(
            "zoo_requests_received",
            "Requests queued for decoding (one per prompt; refused ones not counted).",
        )
        self.finished = counter(
            "zoo_requests_finished",
            "Requests ended, by reason: stop, length, cancelled or error.",
            "reason",
        )
        self.prompt_tokens = counter(
            "zoo_prompt_tokens",
            "Prompt tokens of the requests that got their first token (prefilled).",
        )
        self.generation_tokens = counter(
            "zoo_generation_tokens",
            "Tokens generated (an end-of-text token included, as usage counts it).",
        )
        self.ttft = histogram(
            "zoo_time_to_first_token_seconds",
            "From a request's arrival in the queue to its first token.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "zoo_inter_token_latency_seconds",
            "Between two consecutive tokens of one request.",
            ITL_BUCKETS,
        )
        self.latency = histogram(
            "zoo_request_latency_seconds",
            "From a request's arrival in the queue to its end, whatever the reason.",
            LATENCY_BUCKETS,
        )
        self.models = {name: ModelMetrics(self, name) for name in models}
        self.registry.register(_EngineCollector(engine))

    def model(self, name: str) -> ModelMetrics:
        """The observer of requests for the served model ``name``."""
        return self.models[name]

    def text(self) -> bytes:
        """Every metric in Prometheus's text format (``CONTENT_TYPE_LATEST``)."""
        return generate_latest(self.registry)


#: The prefix cache's counters (``zoo_prefix_cache_<field>_total``): stats field -> help.
_CACHE_COUNTERS = {
    "queries": "Prompts looked up in the prefix cache.",
    "hits": "Prompts that reused at least one cached block.",
    "hit_tokens": "Prompt tokens whose keys and values came from the cache.",
    "miss_tokens": "Prompt tokens looked up and not found (computed).",
    "evictions": "Blocks evicted (least recently used first).",
}

#: What the prefix cache holds now (``zoo_prefix_cache_<field>``): stats field -> help.
_CACHE_GAUGES = {
    "bytes": "Bytes of keys and values held now.",
    "capacity_bytes": "The most bytes the prefix cache may hold.",
    "blocks": "Blocks held now.",
}


class _EngineCollector:
    """What the engine holds at the moment of a scrape: its running and waiting requests
    (the queue's depth) and, when prefix caching is on, the cache's counts."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def describe(self) -> Iterator[Metric]:
        return iter(())  # read at each scrape; nothing to check when registered

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        now = (
            ("zoo_requests_running", "Requests decoding now.", engine.running),
            ("zoo_requests_waiting", "Requests queued for a slot now.", engine.waiting),
            ("zoo_requests_max_running", "Requests that may decode at once.", engine.max_batch),
            ("zoo_requests_max_waiting", "Requests that may wait for a slot.", engine.max_queue),
        )
        for name, help_text, value in now:
            yield GaugeMetricFamily(name, help_text, value=value)
        stats = engine.prefix_cache_stats()
        if stats is None:  # prefix caching is off
            return
        for field, help_text in _CACHE_COUNTERS.items():
            name = f"zoo_prefix_cache_{field}"
            yield CounterMetricFamily(name, help_text, value=getattr(stats, field))
        for field, help_text in _CACHE_GAUGES.items():
            name = f"zoo_prefix_cache_{field}"
            yield GaugeMetricFamily(name, help_text, value=getattr(stats, field))
