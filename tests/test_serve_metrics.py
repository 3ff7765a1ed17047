"""``GET /metrics`` of ``zoo serve``: Prometheus's text format (parsed by
``prometheus_client``'s own parser), counters that move by the requests' known token counts,
histograms with one sample per first token and per gap between tokens, ends counted by
reason, gauges read from the engine, one registry per application, time to first token
counted from the request's arrival in the queue, the API key, ``/health``'s prefix cache, and
the scrape example of docs/serve.md run as written."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from docblocks import DOCS, blocks
from prometheus_client.parser import text_string_to_metric_families
from serve_events import serve_in_thread

import zoo
from zoo.serve.app import create_app
from zoo.serve.engine import Engine
from zoo.serve.limits import Limits
from zoo.serve.metrics import REASONS

MODEL = "shakespeare-byte"
KEY = "sk-metrics-0123"


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return zoo.load(MODEL).eval()


class Local:
    """``create_app`` of a fresh engine behind the server's uvicorn set-up, in threads, on a
    free port of 127.0.0.1; the engine's loop starts with :meth:`start` (or at once)."""

    def __init__(
        self, model: Any, *, start: bool = True, api_key: str | None = None, **engine: Any
    ) -> None:
        engine = {"prefix_cache_bytes": 2**20, **engine}  # a small cache unless told
        self.engine = Engine(model, max_batch=2, max_queue=4, **engine)
        self.key = api_key
        app = create_app(self.engine, model.tokenizer, model_id=MODEL, api_key=api_key)
        self.server, self.port, self.thread = serve_in_thread(app, Limits())
        if start:
            self.engine.start()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, str, bytes]:
        """Status, content type and body of one request."""
        headers = {"Content-Type": "application/json"}
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key}"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            data = None if body is None else json.dumps(body)
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheader("content-type", ""), response.read()
        finally:
            connection.close()

    def complete(self, **fields: Any) -> dict[str, Any]:
        status, _, body = self.request(
            "POST", "/v1/completions", {"model": MODEL, "temperature": 0, **fields}
        )
        assert status == 200, body
        reply: dict[str, Any] = json.loads(body)
        return reply

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of ``/metrics``, parsed: (name, sorted labels) -> value."""
        status, content_type, body = self.request("GET", "/metrics")
        assert status == 200, body
        assert content_type.startswith("text/plain; version="), content_type
        samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.engine.stop(30)


@pytest.fixture
def local(model) -> Iterator[Local]:
    server = Local(model)
    try:
        yield server
    finally:
        server.stop()


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"model": MODEL, **labels}.items())))]


def engine_value(samples: dict[Any, float], name: str) -> float:
    return samples[(name, ())]


def test_counters_and_histograms_move_by_the_requests_known_counts(local):
    before = local.metrics()
    assert value(before, "zoo_requests_received_total") == 0
    assert all(value(before, "zoo_requests_finished_total", reason=r) == 0 for r in REASONS)
    assert engine_value(before, "zoo_requests_max_running") == 2
    assert engine_value(before, "zoo_requests_max_waiting") == 4

    prompts = [[82, 79, 77, 69, 79, 58], [75, 73, 78, 71], [10]]  # token ids: known lengths
    length = local.complete(prompt=prompts[:2], max_tokens=12)  # two sequences in one request
    text = length["choices"][0]["text"]
    assert [c["finish_reason"] for c in length["choices"]] == ["length", "length"], length
    stop = local.complete(prompt=prompts[0], max_tokens=12, stop=[text[3:6]])  # ends at it
    assert stop["choices"][0]["finish_reason"] == "stop", (text, stop)
    one = local.complete(prompt=prompts[2], max_tokens=1)
    counts = [length["usage"]["completion_tokens"] // 2] * 2 + [
        stop["usage"]["completion_tokens"],
        one["usage"]["completion_tokens"],
    ]
    assert counts[0] == 12 and counts[3] == 1 and 0 < counts[2] < 12

    after = local.metrics()
    assert value(after, "zoo_requests_received_total") == 4
    assert value(after, "zoo_requests_finished_total", reason="length") == 3
    assert value(after, "zoo_requests_finished_total", reason="stop") == 1
    prompt_tokens = len(prompts[0]) * 2 + len(prompts[1]) + len(prompts[2])
    assert value(after, "zoo_prompt_tokens_total") == prompt_tokens
    assert value(after, "zoo_generation_tokens_total") == sum(counts)
    ttft = value(after, "zoo_time_to_first_token_seconds_count")
    itl = value(after, "zoo_inter_token_latency_seconds_count")
    assert ttft == 4, "one time to first token per sequence"
    assert itl == sum(c - 1 for c in counts), "one gap per pair of consecutive tokens"
    assert value(after, "zoo_request_latency_seconds_count") == 4
    inf = value(after, "zoo_inter_token_latency_seconds_bucket", le="+Inf")
    assert inf == itl and value(after, "zoo_inter_token_latency_seconds_sum") > 0
    assert engine_value(after, "zoo_requests_running") == 0
    assert engine_value(after, "zoo_requests_waiting") == 0


def _stream_first_chunk(local: Local, max_tokens: int) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", local.port, timeout=60)
    body = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": max_tokens, "stream": True}
    headers = {"Content-Type": "application/json"}
    connection.request("POST", "/v1/completions", json.dumps(body), headers)
    response = connection.getresponse()
    assert response.status == 200, response.read()
    assert response.readline().startswith(b"data: ")
    return connection


def wait_for(local: Local, name: str, target: float, **labels: str) -> dict[Any, float]:
    deadline = time.monotonic() + 60
    while True:
        samples = local.metrics()
        key = (name, tuple(sorted(labels.items())))
        if samples.get(key) == target:
            return samples
        assert time.monotonic() < deadline, f"{name}{labels} never reached {target}"
        time.sleep(0.05)


def test_running_gauge_and_a_cancelled_request(model):
    local = Local(model, start=False)
    go = threading.Event()  # until set, the engine holds after its first step
    step = local.engine.step

    def held_step() -> None:
        step()
        go.wait()
        time.sleep(0.02)  # slow enough that the client's going away is seen mid-way

    local.engine.step = held_step
    local.engine.start()
    try:
        connection = _stream_first_chunk(local, max_tokens=100)  # held after a token or two
        running = local.metrics()
        assert engine_value(running, "zoo_requests_running") == 1
        assert engine_value(running, "zoo_requests_waiting") == 0
        connection.close()  # the client goes away: cancelled at a next step
        go.set()
        after = wait_for(local, "zoo_requests_finished_total", 1, model=MODEL, reason="cancelled")
        assert engine_value(wait_for(local, "zoo_requests_running", 0), "zoo_requests_running") == 0
    finally:
        go.set()
        local.stop()
    tokens = value(after, "zoo_generation_tokens_total")
    assert 1 <= tokens < 100
    assert value(after, "zoo_time_to_first_token_seconds_count") == 1
    assert value(after, "zoo_inter_token_latency_seconds_count") == tokens - 1
    assert value(after, "zoo_prompt_tokens_total") == len("ROMEO:")
    assert value(after, "zoo_request_latency_seconds_count") == 1
    assert value(after, "zoo_requests_finished_total", reason="length") == 0


def test_time_to_first_token_counts_from_the_arrival_in_the_queue(model):
    local = Local(model, start=False)  # the engine's loop is not running: requests wait
    try:
        done: list[dict[str, Any]] = []
        client = threading.Thread(
            target=lambda: done.append(local.complete(prompt="KING", max_tokens=2))
        )
        client.start()
        samples = wait_for(local, "zoo_requests_waiting", 1)
        assert engine_value(samples, "zoo_requests_running") == 0
        assert value(samples, "zoo_requests_received_total") == 1
        time.sleep(0.2)  # the request waits in the queue at least this long
        local.engine.start()
        client.join(60)
        assert done and done[0]["usage"]["completion_tokens"] == 2
        after = local.metrics()
    finally:
        local.stop()
    first = value(after, "zoo_time_to_first_token_seconds_sum")
    assert value(after, "zoo_time_to_first_token_seconds_count") == 1
    assert first >= 0.2, f"time to first token {first:.3f} s, less than the wait in the queue"
    assert value(after, "zoo_request_latency_seconds_sum") >= first
    assert value(after, "zoo_time_to_first_token_seconds_bucket", le="0.1") == 0


def test_two_applications_keep_their_own_counts(model, local):
    other = Local(model, start=False)
    try:
        local.complete(prompt="KING", max_tokens=3)
        assert value(local.metrics(), "zoo_generation_tokens_total") >= 1
        theirs = other.metrics()
    finally:
        other.stop()
    assert value(theirs, "zoo_requests_received_total") == 0
    assert value(theirs, "zoo_generation_tokens_total") == 0
    assert value(theirs, "zoo_time_to_first_token_seconds_count") == 0


#: The prefix cache's fields (zoo.runtime.prefix_cache.PrefixCacheStats) and their metrics.
PREFIX_CACHE = {
    "queries": "zoo_prefix_cache_queries_total",
    "hits": "zoo_prefix_cache_hits_total",
    "hit_tokens": "zoo_prefix_cache_hit_tokens_total",
    "miss_tokens": "zoo_prefix_cache_miss_tokens_total",
    "evictions": "zoo_prefix_cache_evictions_total",
    "bytes": "zoo_prefix_cache_bytes",
    "capacity_bytes": "zoo_prefix_cache_capacity_bytes",
    "blocks": "zoo_prefix_cache_blocks",
}


def test_the_prefix_cache_is_reported_as_health_reports_it(model):
    local = Local(model, api_key=KEY, prefix_cache_bytes=2**20)
    try:
        prompt = list(range(65, 65 + 40))  # 40 ids: two whole blocks of 16 to share
        for _ in range(2):
            local.complete(prompt=prompt, max_tokens=2)
        samples = local.metrics()
        status, _, body = local.request("GET", "/health")
        local.key = None
        refused, _, _ = local.request("GET", "/metrics")
    finally:
        local.stop()
    assert refused == 401, "/metrics needs the API key, as /health does"
    assert status == 200
    health = json.loads(body)["prefix_cache"]
    assert set(health) == set(PREFIX_CACHE), "a field of PrefixCacheStats has no metric"
    assert {name: samples[(name, ())] for name in PREFIX_CACHE.values()} == {
        name: health[field] for field, name in PREFIX_CACHE.items()
    }
    assert health["queries"] == 2 and health["hits"] == 1 and health["hit_tokens"] >= 32
    assert 0 < health["bytes"] <= health["capacity_bytes"] <= 2**20  # whole blocks


def test_without_a_prefix_cache_there_is_none_to_report(model):
    local = Local(model, start=False, prefix_cache_bytes=0)
    try:
        samples = local.metrics()
        status, _, body = local.request("GET", "/health")
    finally:
        local.stop()
    assert status == 200 and json.loads(body)["prefix_cache"] is None
    assert not [name for name, _ in samples if name.startswith("zoo_prefix_cache")]


def test_the_scrape_example_of_the_guide_runs(local):
    local.complete(prompt="KING", max_tokens=4)
    (block,) = [b for b in blocks(DOCS / "serve.md", "python") if "/metrics" in b.text]
    namespace: dict[str, Any] = {}
    code = block.text.replace("127.0.0.1:8000", f"127.0.0.1:{local.port}")
    exec(compile(code, block.where, "exec"), namespace)
    assert namespace["metrics"][("zoo_generation_tokens_total", (("model", MODEL),))] == 4
