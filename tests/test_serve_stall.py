"""One client cannot stall the others: a request's parsing, chat-template rendering and
tokenizing run off the server's event loop, in a bounded pool of threads, and the work one
request may cost is bounded before it is spent (a conversation of more messages than the
context has tokens is refused unrendered; tokens are counted only until the context is
exceeded).

The server is ``create_app`` behind the server's uvicorn set-up, in threads of this process
(as in tests/test_serve_metrics.py), serving a random llama-tiny with Qwen2.5's chat template
through a tokenizer whose methods the tests watch: they hold a rendering or an encode open
and ask ``/health`` meanwhile, so what is checked is an order of events, not a time."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_folders import write_folder
from serve_events import serve_in_thread

import zoo
import zoo.tokenizers
from zoo.serve.app import create_app
from zoo.serve.engine import Engine
from zoo.serve.limits import Limits
from zoo.serve.prepare import PREPARE_THREADS

MODEL = "tiny-chat"
CONTEXT = 1024


class Local:
    """``create_app`` of a fresh engine behind the server's uvicorn set-up, in threads, on a
    free port of 127.0.0.1."""

    def __init__(self, model: Any, tokenizer: Any, *, model_id: str = MODEL, **app: Any) -> None:
        self.engine = Engine(model, max_batch=2, max_queue=8, prefix_cache_bytes=2**20)
        self.model_id = model_id
        application = create_app(self.engine, tokenizer, model_id=model_id, **app)
        self.server, self.port, self.thread = serve_in_thread(application, Limits())
        self.engine.start()

    def request(
        self, method: str, path: str, body: Any = None, key: str | None = None, timeout: float = 60
    ) -> tuple[int, dict[str, Any]]:
        """Status and JSON body of one request."""
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body)
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            connection.close()

    def chat(self, messages: list[dict[str, Any]], **fields: Any) -> tuple[int, dict[str, Any]]:
        body = {"model": self.model_id, "messages": messages, "max_tokens": 2, **fields}
        return self.request("POST", "/v1/chat/completions", body)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.engine.stop(30)


class Watched:
    """A tokenizer's renderings and encodes, counted (ids produced) and, while ``hold`` is
    set, held open until it is cleared: what a test asks ``/health`` during."""

    def __init__(self, tokenizer: Any) -> None:
        self.renders = 0
        self.ids = 0
        self.running = 0
        self.most_at_once = 0
        self.entered = threading.Semaphore(0)
        self.hold = threading.Event()
        self.lock = threading.Lock()
        for name in ("encode", "iter_encode", "encode_batch", "apply_chat_template"):
            setattr(tokenizer, name, self._watch(name, getattr(tokenizer, name)))

    def _watch(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.running += 1
                self.most_at_once = max(self.most_at_once, self.running)
                self.renders += name == "apply_chat_template"
            try:
                self.entered.release()
                deadline = time.monotonic() + 10
                while self.hold.is_set() and time.monotonic() < deadline:
                    time.sleep(0.005)
                result = method(*args, **kwargs)
                if name == "iter_encode":
                    result = list(result)
                    self._count(sum(len(ids) for ids in result))
                    return iter(result)
                if name in ("encode", "encode_batch") or kwargs.get("tokenize"):
                    flat = result if name != "encode_batch" else [i for r in result for i in r]
                    self._count(len(flat))
                return result
            finally:
                with self.lock:
                    self.running -= 1

        return watched

    def _count(self, n: int) -> None:
        with self.lock:
            self.ids += n


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("chat") / "tokenizer", "qwen2.5-instruct")


@pytest.fixture(scope="module")
def model(folder) -> torch.nn.Module:
    tok = zoo.tokenizers.load_folder(folder)
    torch.manual_seed(0)
    return zoo.build("llama-tiny", vocab_size=tok.vocab_size, context_length=CONTEXT).eval()


@pytest.fixture
def watched(model, folder) -> Iterator[tuple[Local, Watched]]:
    tok = zoo.tokenizers.load_folder(folder)
    watch = Watched(tok)
    server = Local(model, tok)
    try:
        yield server, watch
    finally:
        watch.hold.clear()
        server.stop()


def test_a_conversation_of_more_messages_than_the_context_is_refused_unrendered(watched):
    server, watch = watched
    status, body = server.chat([{"role": "user", "content": "hi"}] * (CONTEXT + 1))
    assert status == 400, body
    error = body["error"]
    assert error["code"] == "too_many_messages" and error["param"] == "messages"
    assert f"{CONTEXT + 1} messages" in error["message"] and str(CONTEXT) in error["message"]
    assert watch.renders == 0 and watch.ids == 0, "refused before any rendering or tokenizing"
    status, body = server.chat([{"role": "user", "content": "hi"}] * 3)
    assert status == 200, body


def test_tokens_are_counted_only_until_the_context_is_exceeded(watched):
    server, watch = watched
    # 1,000 messages (under the cap) that render to about 230,000 tokens, one per byte
    status, body = server.chat([{"role": "user", "content": "x" * 200}] * 1000)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert str(CONTEXT) in body["error"]["message"]
    assert watch.renders == 1
    assert watch.ids <= CONTEXT + 2**15, f"{watch.ids} ids counted for a context of {CONTEXT}"


def test_health_answers_while_a_rendering_and_an_encode_are_in_progress(watched):
    server, watch = watched
    watch.hold.set()
    with ThreadPoolExecutor(2) as pool:
        chat = pool.submit(server.chat, [{"role": "user", "content": "hi"}])
        assert watch.entered.acquire(timeout=30), "the rendering never started"
        status, health = server.request("GET", "/health", timeout=8)  # the rendering is held
        assert status == 200 and health["status"] == "ok"
        assert watch.running >= 1, "/health was answered while the rendering was held open"
        watch.hold.clear()
        assert chat.result(timeout=60)[0] == 200
        while watch.entered.acquire(blocking=False):  # the chat's own encode entered too
            pass
        watch.hold.set()
        text = {"model": MODEL, "prompt": "plain text, encoded", "max_tokens": 2}
        completion = pool.submit(server.request, "POST", "/v1/completions", text)
        assert watch.entered.acquire(timeout=30), "the encode never started"
        status, _ = server.request("GET", "/health", timeout=8)
        assert status == 200 and watch.running >= 1
        watch.hold.clear()
        assert completion.result(timeout=60)[0] == 200


def test_renderings_run_in_a_bounded_pool(watched):
    server, watch = watched
    watch.hold.set()
    clients = PREPARE_THREADS + 3
    with ThreadPoolExecutor(clients) as pool:
        chats = [
            pool.submit(server.chat, [{"role": "user", "content": f"hi {i}"}])
            for i in range(clients)
        ]
        for _ in range(PREPARE_THREADS):
            assert watch.entered.acquire(timeout=30)
        time.sleep(0.3)  # the other requests have arrived and wait for a thread
        assert server.request("GET", "/health", timeout=8)[0] == 200
        assert watch.running == PREPARE_THREADS
        watch.hold.clear()
        assert [c.result(timeout=120)[0] for c in chats] == [200] * clients
    assert watch.most_at_once == PREPARE_THREADS


def test_bodies_that_cannot_be_read_are_400s_naming_the_fault(watched):
    server, watch = watched
    messages = [{"role": "user", "content": "hi"}] * 600
    messages[300] = {"role": 5, "content": "hi"}  # in the second batch validated
    status, body = server.chat(messages)
    assert status == 400 and body["error"]["param"] == "messages.300.role", body
    for raw, content_type, says in [
        (b"[" * 100_000, "application/json", "nested too deeply"),
        (
            b'{"model": "tiny-chat", "messages": ' + b"[" * 150 + b"]" * 150 + b"}",
            "application/json",
            "more than 100 levels",
        ),
        (b'{"model": ', "application/json", "not valid JSON"),
        (b'{"model": "tiny-chat"}', "text/plain", "must be JSON"),
        (b"", "application/json", "empty"),
    ]:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        try:
            connection.request("POST", "/v1/chat/completions", raw, {"Content-Type": content_type})
            response = connection.getresponse()
            status, body = response.status, json.loads(response.read())
        finally:
            connection.close()
        assert status == 400 and says in body["error"]["message"], (says, body)
    assert watch.renders == 0


def test_long_id_prompts_are_refused_unread_and_validated_a_row_at_a_time(watched):
    server, _ = watched
    # more ids than the context holds, one of them bad: refused by its length, unread
    ids: list[object] = [1] * (CONTEXT * 4)
    ids[CONTEXT * 2] = "x"
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1}
    status, reply = server.request("POST", "/v1/completions", body)
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded", reply
    rows = [[1, 2, 3], [4, 5, 6], [7, 8, True]]  # strict: true is not an id
    body = {"model": MODEL, "prompt": rows, "max_tokens": 1}
    status, reply = server.request("POST", "/v1/completions", body)
    assert status == 400 and reply["error"]["param"] == "prompt.2.2", reply
    long_row = [[1, 2], [3] * CONTEXT]
    body = {"model": MODEL, "prompt": long_row, "max_tokens": 1}
    status, reply = server.request("POST", "/v1/completions", body)
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded", reply
    assert "prompt 1" in reply["error"]["message"]
    body = {"model": MODEL, "prompt": [[1, 2], [3, 4]], "max_tokens": 1, "temperature": 0}
    status, reply = server.request("POST", "/v1/completions", body)
    assert status == 200 and len(reply["choices"]) == 2, reply
