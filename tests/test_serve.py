"""``zoo serve``: continuous batching (rows at their own positions give what each gives
alone), the engine, streamed text, and a real server process driven by the official
``openai`` client: completions equal to ``zoo.generate``'s alone and among others,
streaming, chat through a template, every error case (the server keeps serving), the API
key, oversized bodies, a full queue, a client that disconnects, and SIGTERM's drain."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from chat_folders import write_folder
from serve_events import Collect

import zoo
from zoo.cli import main
from zoo.generation import GenerationConfig, generate_ids
from zoo.generation.detokenize import TextStream
from zoo.runtime.slots import SlotBatch
from zoo.serve.engine import Engine, Finish, Request
from zoo.testing import small_overrides

KEY = "sk-test-0123456789"


def lively(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights of std 1, so that greedy decoding of a random model does not collapse into
    one repeated token and its logits are far apart (an argmax no rounding flips)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g))
    return model.eval()


def shakespeare() -> torch.nn.Module:
    return zoo.load("shakespeare-byte").eval()


def alone(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """The greedy continuation of ``prompt`` by zoo.generate's core, on its own."""
    config = GenerationConfig(max_new_tokens=n, temperature=0)
    return generate_ids(model, torch.tensor([prompt]), None, config)[0, len(prompt) :].tolist()


# -- the slot batch: rows at their own positions -------------------------------------------
MODELS = {
    "shakespeare-byte": shakespeare,  # trained weights, learned positions
    "llama-tiny": lambda: lively(zoo.build("llama-tiny")),  # rotary, grouped-query
    "mistral-window": lambda: lively(  # a sliding window shorter than the sequences
        zoo.build("mistral-7b-v0.3", **small_overrides("mistral-7b-v0.3"), sliding_window=5)
    ),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_rows_that_join_and_leave_decode_as_each_would_alone(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    vocab = min(model.config.vocab_size, 256)
    prompts = [torch.randint(0, vocab, (n,)).tolist() for n in (5, 11, 3, 8, 1, 6)]
    lengths = [12, 4, 9, 7, 10, 5]  # rows end at different steps, so others move into slots
    expected = [alone(model, p, n) for p, n in zip(prompts, lengths, strict=True)]
    batch: SlotBatch[int] = SlotBatch(model, max_rows=3)
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    waiting = list(range(len(prompts)))
    sizes = []
    with torch.inference_mode():
        while waiting or len(batch):
            while waiting and batch.free:  # a prompt joins while the others are mid-way
                i = waiting.pop(0)
                got[i].append(int(batch.add(i, prompts[i]).argmax()))
            for key in [k for k in batch.keys if len(got[k]) == lengths[k]]:
                batch.remove(key)
            if len(batch):
                sizes.append(len(batch))
                logits = batch.step(torch.tensor([got[k][-1] for k in batch.keys]))
                for key, row in zip(list(batch.keys), logits, strict=True):
                    got[key].append(int(row.argmax()))
    assert [got[i] for i in range(len(prompts))] == expected
    assert max(sizes) == 3 and min(sizes) < 3, "the batch never filled or never drained"


def test_a_step_gives_the_logits_a_row_gives_alone():
    torch.manual_seed(0)
    model = zoo.build("llama-tiny").eval()
    short, long = [1, 2, 3], [9, 8, 7, 6, 5, 4, 3]
    batch: SlotBatch[str] = SlotBatch(model, max_rows=2)
    with torch.inference_mode():
        batch.add("short", short)
        batch.add("long", long)
        stepped = batch.step(torch.tensor([10, 11]))  # (2, vocab)
        for row, ids in enumerate(([*short, 10], [*long, 11])):
            reference = model(torch.tensor([ids]))[0, -1]
            torch.testing.assert_close(stepped[row], reference, atol=1e-5, rtol=1e-5)
    assert batch.length("short") == 4 and batch.length("long") == 8


def test_a_slot_batch_says_what_it_cannot_do():
    with pytest.raises(ValueError, match="DecoderLM"):
        SlotBatch(zoo.build("transformer-encdec-tiny"), 2)  # type: ignore[arg-type]
    model = zoo.build("llama-tiny", context_length=16).eval()
    batch: SlotBatch[int] = SlotBatch(model, 1)
    with pytest.raises(ValueError, match="no room for a new token"):
        batch.add(0, list(range(16)))
    with torch.inference_mode():
        batch.add(0, [1, 2])
        with pytest.raises(ValueError, match="all 1 slots are in use"):
            batch.add(1, [1])
        with pytest.raises(ValueError, match="one token per sequence"):
            batch.step(torch.tensor([1, 2]))


# -- the text of new tokens -----------------------------------------------------------------
def _pieces(tok: Any, context: list[int], new: list[int], stops: tuple[str, ...] = ()) -> list[str]:
    stream = TextStream(tok, context, stops)
    pieces = [stream.push(t) for t in new]
    return [p for p in [*pieces, stream.finish()] if p]


def test_streamed_pieces_join_to_the_text_generate_returns():
    model = shakespeare()
    tok = model.tokenizer
    prompt = tok.encode("ROMEO:")
    text = zoo.generate(model, "ROMEO:", max_new_tokens=40, temperature=0)
    pieces = _pieces(tok, prompt, alone(model, prompt, 40))
    assert "".join(pieces) == text and len(pieces) > 10


def test_a_character_split_across_tokens_waits_for_its_rest():
    tok = shakespeare().tokenizer
    first, second = "é".encode()  # two bytes, two tokens of the byte tokenizer
    stream = TextStream(tok, tok.encode("a"), ())
    assert stream.push(first) == ""
    assert stream.push(second) == "é"


def test_text_ends_before_a_stop_string_split_across_pieces():
    tok = shakespeare().tokenizer
    new = tok.encode("one, two; END three")
    assert "".join(_pieces(tok, [65], new, ("END",))) == "one, two; "
    stream = TextStream(tok, [65], ("END", "xyz"))
    sent = "".join(stream.push(t) for t in tok.encode("abEN"))
    assert sent == "ab", "text that may start a stop string is held back"
    assert stream.push(tok.encode("D")[0]) == "" and stream.stopped


# -- the engine: requests join the running batch -------------------------------------------
def test_the_engine_admits_requests_between_steps_of_the_running_ones():
    model = shakespeare()
    tok = model.tokenizer
    engine = Engine(model, max_batch=4, max_queue=4, max_stall=None)  # a budget of 512
    sizes: list[int] = []
    prefills: list[int] = []
    step, extend = engine.runner.batch.step, engine.runner.batch.extend

    def counting_step(tokens: torch.Tensor, keys: list[Request]) -> torch.Tensor:
        sizes.append(len(tokens))
        return step(tokens, keys)

    def counting_extend(chunks: list[tuple[Request, list[int]]]) -> torch.Tensor:
        prefills.append(len(chunks))
        return extend(chunks)

    both, merged = engine.runner.batch.step_and_extend, []

    def counting_both(tokens: torch.Tensor, keys: list[Request], chunks: list) -> object:
        out = both(tokens, keys, chunks)
        if out is not None:  # one pass for the step and the chunks (None: they run apart)
            sizes.append(len(tokens))
            prefills.append(len(chunks))
            merged.append(1)
        return out

    engine.runner.batch.step = counting_step  # type: ignore[method-assign]
    engine.runner.batch.extend = counting_extend  # type: ignore[method-assign]
    engine.runner.batch.step_and_extend = counting_both  # type: ignore[method-assign]
    flushes: list[int] = []  # a burst's events are flushed once, whoever emitted them
    engine.start()
    try:
        prompts = ["ROMEO:", "JULIET:\nO", "First Citizen:", "KING"]
        config = GenerationConfig(max_new_tokens=100, temperature=0)
        sinks = [Collect() for _ in prompts]

        def sequence(prompt: str, sink: Collect) -> Request:
            return Request(tok.encode(prompt), config, tok, sink, tok.end_ids, flush)

        def flush() -> None:
            flushes.append(1)

        engine.submit([sequence(prompts[0], sinks[0])])
        assert sinks[0].started.wait(30)
        engine.submit([sequence(p, sink) for p, sink in zip(prompts[1:], sinks[1:], strict=True)])
        assert all(s.done.wait(60) for s in sinks)
    finally:
        engine.stop()
    passes = len(sizes) + len(prefills) - len(merged)
    assert len(flushes) == passes, "not one flush per pass (a step, a prefill, or both at once)"
    assert prefills == [1, 3], "the prompts waiting together were not prefilled together"
    assert sinks[0].finish is not None and sinks[0].finish.reason == "length"
    for prompt, sink in zip(prompts, sinks, strict=True):
        assert "".join(sink.pieces) == zoo.generate(
            model, prompt, max_new_tokens=100, temperature=0
        )
    assert sizes[0] == 1 and max(sizes) == 4, f"the later requests did not join: {sizes[:20]}"
    assert engine.running == 0 and engine.waiting == 0


def test_a_cancelled_sequence_frees_its_slot_and_a_full_queue_refuses():
    model = lively(zoo.build("llama-tiny", vocab_size=257, context_length=4096))
    tok = shakespeare().tokenizer  # the byte tokenizer: 257 ids
    engine = Engine(model, max_batch=1, max_queue=1)
    engine.start()
    try:
        long, short = Collect(), Collect()
        config = GenerationConfig(max_new_tokens=4000, temperature=0)
        running = Request([1, 2, 3], config, tok, long)
        engine.submit([running])
        assert long.started.wait(30) or long.done.wait(1)
        engine.submit([Request([4], GenerationConfig(max_new_tokens=3, temperature=0), tok, short)])
        from zoo.serve.scheduler import QueueFull

        with pytest.raises(QueueFull, match="busy"):
            engine.submit([Request([5], config, tok, Collect())])
        running.cancel()
        assert long.done.wait(30) and short.done.wait(30)
    finally:
        engine.stop()
    assert long.finish is not None and long.finish.reason == "cancelled"
    assert long.finish.completion_tokens < 4000
    assert short.finish is not None and short.finish.reason in ("length", "stop")


def test_pieces_that_wait_together_reach_the_client_as_one():
    from zoo.serve.runs import Run

    tok = shakespeare().tokenizer
    done_a, done_b = Finish("stop", 1, 3), Finish("length", 1, 2)

    async def events() -> list[tuple[int, Any]]:
        run = Run([[65], [66]], GenerationConfig(max_new_tokens=3), tok, ())
        a, b = run.sequences
        for event in ("x", "y"):
            a.emit(event)
        b.emit("p")
        a.emit("z")
        b.emit(done_b)
        a.emit(done_a)
        with pytest.raises(TimeoutError):  # queued: nothing reaches the loop before a flush
            await asyncio.wait_for(anext(run.events()), 0.05)
        a.flush()  # the engine flushes once a step is done
        await asyncio.sleep(0)  # the loop delivers the burst
        return [item async for item in run.events()]

    assert asyncio.run(events()) == [(0, "xyz"), (1, "p"), (1, done_b), (0, done_a)]


# -- a real server process ------------------------------------------------------------------
class Server:
    """``zoo serve`` in a child process on a free port of 127.0.0.1."""

    def __init__(self, folder: Path, *args: str, env: dict[str, str] | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.out = folder / "stdout.txt"
        self.err = folder / "stderr.txt"
        command = [sys.executable, "-m", "zoo.cli", "serve", *args, "--port", "0"]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(
                [*command, "--log-level", "warning"],
                stdout=out,
                stderr=err,
                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
            )
        deadline = time.monotonic() + 120
        while "listening on" not in self.out.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"zoo serve did not start:\n{self.err.read_text()[-3000:]}")
            time.sleep(0.1)
        line = self.out.read_text().split("listening on ", 1)[1].split()[0]
        self.url = line  # http://127.0.0.1:PORT/v1
        self.port = int(line.rsplit(":", 1)[1].split("/")[0])

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=120)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """One raw HTTP request: the status and the JSON body."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            connection.close()

    def health(self, key: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        status, body = self.request("GET", "/health", headers=headers)
        assert status == 200, body
        return body

    def wait_for(self, key: str | None = None, timeout: float = 30, **state: int) -> None:
        deadline = time.monotonic() + timeout
        while True:
            health = self.health(key)
            if all(health[k] == v for k, v in state.items()):
                return
            assert time.monotonic() < deadline, f"never reached {state}: {health}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def byte_server(tmp_path_factory) -> Iterator[Server]:
    """shakespeare-byte (trained, no chat template), four slots."""
    server = Server(tmp_path_factory.mktemp("byte"), "shakespeare-byte", "--max-batch", "4")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """A random llama with a chat template (Qwen2.5's) whose end-of-turn and end-of-text ids
    are never picked (their head rows are 0: logit 0, below the largest of the others), and a
    context long enough that a request can run for minutes: what the queue, disconnect and
    SIGTERM tests hold a slot with."""
    folder = tmp_path_factory.mktemp("chat")
    tok = zoo.tokenizers.load_folder(write_folder(folder / "tokenizer", "qwen2.5-instruct"))
    torch.manual_seed(0)
    model = lively(zoo.build("llama-tiny", vocab_size=tok.vocab_size, context_length=32768))
    with torch.no_grad():
        model.head.weight[list(tok.end_ids)] = 0
    return zoo.save(model, folder / "model", tokenizer=tok)


@pytest.fixture(scope="module")
def chat_server(chat_model, tmp_path_factory) -> Iterator[Server]:
    """One slot, one place in the queue, an API key (from ZOO_API_KEY) and a 2 KiB body limit."""
    server = Server(
        tmp_path_factory.mktemp("chat-server"),
        str(chat_model),
        "--served-model-name", "tiny-chat",
        "--max-batch", "1", "--max-queue", "1", "--max-body-bytes", "2048",
        env={"ZOO_API_KEY": KEY},
    )  # fmt: skip
    yield server
    server.stop()


PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "First Citizen:\nBefore we", "KING HENRY", "A", "\n\n"]


def test_models_lists_the_served_model(byte_server):
    models = byte_server.client().models.list()
    assert [m.id for m in models.data] == ["shakespeare-byte"]


def test_greedy_completions_equal_generate_alone_and_among_others(byte_server):
    model = shakespeare()
    expected = [zoo.generate(model, p, max_new_tokens=48, temperature=0) for p in PROMPTS]
    client = byte_server.client()

    def complete(prompt: str) -> tuple[str, str | None, Any]:
        out = client.completions.create(
            model="shakespeare-byte", prompt=prompt, max_tokens=48, temperature=0
        )
        return out.choices[0].text, out.choices[0].finish_reason, out.usage

    one_at_a_time = [complete(p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # more requests than slots: some wait
        together = list(pool.map(complete, PROMPTS))
    assert [t for t, _, _ in one_at_a_time] == expected
    assert [t for t, _, _ in together] == expected
    _, finish, usage = one_at_a_time[0]
    assert finish == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (len("ROMEO:"), 48)


def test_token_id_prompts_and_several_prompts_in_one_request(byte_server):
    model = shakespeare()
    ids = model.tokenizer.encode("ROMEO:")
    client = byte_server.client()
    out = client.completions.create(
        model="shakespeare-byte", prompt=ids, max_tokens=20, temperature=0
    )
    assert out.choices[0].text == zoo.generate(model, "ROMEO:", max_new_tokens=20, temperature=0)
    out = client.completions.create(
        model="shakespeare-byte", prompt=PROMPTS[:3], max_tokens=20, temperature=0
    )
    texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    assert texts == [zoo.generate(model, p, max_new_tokens=20, temperature=0) for p in PROMPTS[:3]]
    assert out.usage.completion_tokens == 60


def test_streaming_sends_the_same_text_in_pieces_then_usage(byte_server):
    model = shakespeare()
    expected = zoo.generate(model, "ROMEO:", max_new_tokens=30, temperature=0)
    stream = byte_server.client().completions.create(
        model="shakespeare-byte",
        prompt="ROMEO:",
        max_tokens=30,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(pieces) == expected and len(pieces) > 3  # (pieces waiting merge)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 30


def test_stop_strings_and_seeded_sampling(byte_server):
    model = shakespeare()
    client = byte_server.client()
    full = zoo.generate(model, "ROMEO:", max_new_tokens=60, temperature=0)
    stop = full[12:15]  # text from the middle: the reply ends where it first appears
    out = client.completions.create(
        model="shakespeare-byte", prompt="ROMEO:", max_tokens=60, temperature=0, stop=[stop, "#"]
    )
    assert out.choices[0].text == full[: full.index(stop)] and len(out.choices[0].text) >= 2
    assert out.choices[0].finish_reason == "stop"
    settings = dict(model="shakespeare-byte", prompt="ROMEO:", max_tokens=40, temperature=0.9)
    a = client.completions.create(**settings, seed=123).choices[0].text
    b = client.completions.create(**settings, seed=123).choices[0].text
    c = client.completions.create(**settings, seed=124).choices[0].text
    assert a == b != c
    reference = zoo.generate(model, "ROMEO:", max_new_tokens=40, temperature=0.9, seed=123)
    assert a == reference


def test_the_extremes_of_every_sampling_field_are_answered(byte_server):
    """``"temperature": 1, "top_p": 1e-300`` (in the documented range) was once
    a 500 (``probability tensor contains either inf, nan or element < 0``). Every extreme a
    request may hold is a 200; those that leave only the most likely token give the greedy
    text."""
    client = byte_server.client()
    as_greedy = [
        {"temperature": 0},
        {"temperature": 1, "top_p": 1e-300},
        {"temperature": 2, "top_p": 5e-324, "seed": 2**64 - 1},
        {"temperature": 5e-324, "top_p": 1.0, "top_k": 10**30, "seed": -(2**63)},
        {"temperature": 2, "top_k": 1},
    ]
    sampling = [{"temperature": 2, "top_p": 1.0, "top_k": 256, "seed": 0}]

    def complete(fields: dict[str, Any]) -> Any:  # the fields sent as they are given
        return client.completions.create(
            model="shakespeare-byte", prompt="ROMEO:", max_tokens=8, extra_body=fields
        ).choices[0]

    with ThreadPoolExecutor(len(as_greedy) + len(sampling)) as pool:  # decoded together
        outs = list(pool.map(complete, as_greedy + sampling))
    greedy = outs[0].text
    for fields, out in zip(as_greedy + sampling, outs, strict=True):
        assert out.finish_reason == "length", fields
        assert out.text == greedy or fields in sampling, fields


def _error(call: Any, expected: type[openai.APIStatusError]) -> dict[str, Any]:
    with pytest.raises(expected) as caught:
        call()
    body = caught.value.response.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    return body["error"]


def test_each_bad_request_is_a_4xx_in_openai_shape_and_the_server_goes_on(byte_server):
    client = byte_server.client()
    ok = dict(model="shakespeare-byte", prompt="ROMEO:", max_tokens=4)

    def complete(**changes: Any) -> Any:  # the client sends any value as it is given
        return lambda: client.completions.create(**{**ok, **changes})

    error = _error(complete(model="gpt-5"), openai.NotFoundError)
    assert error["code"] == "model_not_found" and "shakespeare-byte" in error["message"]
    cases = {
        "negative max_tokens": complete(max_tokens=-1),
        "zero max_tokens": complete(max_tokens=0),
        "absurd max_tokens": complete(max_tokens=10**12),
        "max_tokens as text": complete(max_tokens="5"),
        "prompt longer than the context": complete(prompt="x" * 200),
        "prompt of the wrong type": complete(prompt={"text": "hi"}),
        "empty prompt": complete(prompt=""),
        "ids outside the vocabulary": complete(prompt=[1, 2, 300]),
        "n of 2": complete(n=2),
        "temperature above 2": complete(temperature=3),
        "top_p of 0": complete(top_p=0),
        "an empty stop string": complete(stop=[""]),
        "a seed beyond 2**64": complete(seed=2**70),
    }
    for what, call in cases.items():
        error = _error(call, openai.BadRequestError)
        assert error["type"] == "invalid_request_error", what
    error = _error(complete(max_tokens=500), openai.BadRequestError)
    assert error["code"] == "context_length_exceeded" and "128" in error["message"]
    error = _error(
        lambda: client.chat.completions.create(
            model="shakespeare-byte", messages=[{"role": "user", "content": "hi"}]
        ),
        openai.BadRequestError,
    )
    assert error["code"] == "no_chat_template" and "/v1/completions" in error["message"]
    status, body = byte_server.request(
        "POST",
        "/v1/completions",
        b'{"model": "shakespeare-byte", "prompt": ',
        {"Content-Type": "application/json"},
    )
    assert status == 400 and "JSON" in body["error"]["message"]
    status, body = byte_server.request("GET", "/v1/nowhere")
    assert status == 404 and set(body) == {"error"}
    out = client.completions.create(**ok)  # still serving
    assert out.choices[0].finish_reason == "length"
    assert byte_server.process.poll() is None


def test_chat_renders_the_template_and_streams(chat_server, chat_model):
    model = zoo.load(str(chat_model))
    tok = model.tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    new = zoo.generate(model, prompt, max_new_tokens=12, temperature=0)[len(prompt) :]
    client = chat_server.client(KEY)
    out = client.chat.completions.create(
        model="tiny-chat", messages=messages, max_tokens=12, temperature=0
    )
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == tok.decode(new)
    assert out.usage.prompt_tokens == len(prompt) and out.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model="tiny-chat", messages=messages, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == tok.decode(new)
    assert chunks[-1].choices[0].finish_reason == "length"
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    out = client.chat.completions.create(model="tiny-chat", messages=text_parts, max_tokens=2)
    assert out.choices[0].finish_reason == "length"


def test_every_request_needs_the_api_key(chat_server):
    error = _error(lambda: chat_server.client("sk-wrong").models.list(), openai.AuthenticationError)
    assert error["code"] == "invalid_api_key"
    status, body = chat_server.request("GET", "/health")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, _ = chat_server.request("GET", "/v1/models", headers={"Authorization": KEY})
    assert status == 401, "the key without the Bearer scheme"
    assert chat_server.client(KEY).models.list().data[0].id == "tiny-chat"


def test_a_body_over_the_limit_is_refused_before_it_is_read(chat_server):
    big = json.dumps({"model": "tiny-chat", "prompt": "x" * 4000}).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    status, body = chat_server.request("POST", "/v1/completions", big, headers)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    connection = http.client.HTTPConnection("127.0.0.1", chat_server.port, timeout=60)
    try:  # no Content-Length: counted as it arrives
        connection.request(
            "POST", "/v1/completions", iter([big[:1500], big[1500:]]), headers, encode_chunked=True
        )
        response = connection.getresponse()
        assert response.status == 413 and b"request_too_large" in response.read()
    finally:
        connection.close()
    status, body = chat_server.request(
        "POST", "/v1/completions", big, {"Content-Type": "application/json"}
    )
    assert status == 401, "the key is checked before the size"
    assert chat_server.health(KEY)["running"] == 0


def _stream_first_chunk(server: Server, max_tokens: int) -> tuple[http.client.HTTPConnection, Any]:
    """Start a streamed completion over a raw connection and read its first event."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {"model": "tiny-chat", "prompt": [1, 2, 3], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    connection.request("POST", "/v1/completions", json.dumps(body).encode(), headers)
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: {")
    return connection, response


def test_a_full_queue_answers_429_and_a_disconnect_frees_the_slot(chat_server):
    client = chat_server.client(KEY)
    connection, _ = _stream_first_chunk(chat_server, 30000)  # minutes of tokens: holds the slot
    chat_server.wait_for(KEY, running=1)
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(
            client.completions.create, model="tiny-chat", prompt="hi", max_tokens=5
        )
        chat_server.wait_for(KEY, waiting=1)
        error = _error(
            lambda: client.completions.create(model="tiny-chat", prompt="hi", max_tokens=5),
            openai.RateLimitError,
        )
        assert error["type"] == "rate_limit_error" and "busy" in error["message"]
        connection.close()  # the client goes away: its slot goes to the queued request
        out = queued.result(timeout=60)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5
    chat_server.wait_for(KEY, running=0, waiting=0, timeout=10)


def test_a_non_streamed_request_whose_client_leaves_frees_its_slot(chat_server):
    connection = http.client.HTTPConnection("127.0.0.1", chat_server.port, timeout=120)
    body = {"model": "tiny-chat", "prompt": [1, 2], "max_tokens": 30000, "temperature": 0}
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    connection.request("POST", "/v1/completions", json.dumps(body).encode(), headers)
    chat_server.wait_for(KEY, running=1)
    connection.close()
    chat_server.wait_for(KEY, running=0, timeout=10)


@pytest.mark.slow
def test_sigterm_drains_the_requests_in_flight_then_exits_0(chat_model, tmp_path):
    server = Server(tmp_path, str(chat_model), "--served-model-name", "tiny-chat",
                    "--max-batch", "2", env={"ZOO_API_KEY": KEY})  # fmt: skip
    try:
        _, response = _stream_first_chunk(server, 3000)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while True:  # the listening socket closes at once...
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
            time.sleep(0.05)
        events = [line for line in response.read().split(b"\n\n") if line.strip()]
        assert events[-1] == b"data: [DONE]"  # ...and the request in flight ends in full
        usage = json.loads(events[-2].removeprefix(b"data: "))["usage"]
        assert usage["completion_tokens"] == 3000
        assert server.process.wait(60) == 0
    finally:
        server.stop()


def test_serve_has_help_and_refuses_what_it_cannot_serve(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0 and "--max-batch" in capsys.readouterr().out
    # an encoder-decoder is served (tests/test_serve_encdec.py); without a tokenizer it is not
    code = main(["serve", "transformer-encdec-tiny", "--random", "--port", "0"])
    _, err = capsys.readouterr()
    assert code == 2 and "no fixed vocabulary" in err and err.count("\n") == 1
