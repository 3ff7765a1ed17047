"""``zoo serve`` on an encoder-decoder: a completion's prompt is the source, its completion the
target. The slot batch (each source encoded once, decoder rows at their own positions) gives
each row the tokens and logits it gives alone, for zoo's transformer-encdec and for Marian,
BART and T5 folders that transformers saved (T5's relative bias read per row); the engine's
requests, joining at different steps beside others of different lengths, greedy and seeded
sampled, under a Marian checkpoint's generation_config.json (its start token, banned pad,
forced end), pick exactly zoo.generate's tokens for their source alone; the HTTP app answers
concurrent completions (text, finish_reason, usage counting source tokens), streams, takes
id prompts and several prompts, renders a conversation through a chat template as the source
and refuses chat without one, beam search, sources too long and targets too long, each as a
400; the engine refuses adapters and compiling; ``zoo serve FOLDER`` serves a saved one."""

from __future__ import annotations

import dataclasses
import http.client
import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from serve_events import Collect, serve_in_thread

import zoo
from zoo.generation import GenerationConfig, generate_ids
from zoo.runtime.encdec_slots import EncoderDecoderSlots, check_encoder_decoder_batchable
from zoo.serve.app import create_app
from zoo.serve.encdec_runner import source_settings
from zoo.serve.engine import Engine, Request
from zoo.serve.limits import Limits
from zoo.serve.source_prompts import TargetText
from zoo.tokenizers import SubwordBPE
from zoo.tokenizers.chat_files import with_chat_template

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

MODEL = "translator"
TEXTS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the quick brown fox jumps over the lazy dog",
    "where is the train station",
    "I would like a cup of tea, please",
]
#: A template that renders a conversation as its messages' text, one a line.
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def lively(model: Any, std: float = 1.0, seed: int = 0) -> Any:
    """Weight matrices of std 1, so that greedy decoding of a random model does not collapse
    into one repeated token and its logits are far apart (an argmax no rounding flips)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


@pytest.fixture(scope="module")
def tok() -> SubwordBPE:
    """A trained byte-level BPE: <pad> 0, <unk> 1, <s> 2, </s> 3."""
    return SubwordBPE.train(TEXTS * 20, 300)


def _marian(folder: Path, vocab: int, eos: int, generation: dict[str, Any] | None) -> Any:
    """zoo's load of a tiny MarianMTModel folder (pad 0 = the decoder's start, as OPUS-MT)."""
    config = transformers.MarianConfig(
        vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=0,
        decoder_start_token_id=0, eos_token_id=eos, forced_eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.MarianMTModel(config).save_pretrained(folder)
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return lively(zoo.load(folder))


def _t5(folder: Path) -> Any:
    config = transformers.T5Config(
        vocab_size=99, d_model=32, d_ff=48, num_heads=4, d_kv=8, num_layers=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=12,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder)
    return lively(zoo.load(folder), std=0.5)


def _bart(folder: Path) -> Any:
    config = transformers.BartConfig(
        vocab_size=100, d_model=24, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=3, decoder_attention_heads=3, encoder_ffn_dim=40,
        decoder_ffn_dim=40, max_position_embeddings=32, scale_embedding=True,
        forced_eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BartForConditionalGeneration(config).save_pretrained(folder)
    return lively(zoo.load(folder))


MODELS = {
    "transformer-encdec": lambda folder: lively(
        zoo.build("transformer-encdec-tiny", vocab_size=300, context_length=48), std=0.3
    ),
    "marian": lambda folder: _marian(folder, 120, 1, None),
    "t5-relative-bias": _t5,
    "bart": _bart,
}


def _alone(model: Any, source: list[int], n: int, start: int) -> list[int]:
    """The greedy target of ``source`` by zoo.generate's core, on its own (no end id)."""
    config = GenerationConfig(max_new_tokens=n, temperature=0, start_id=start)
    return generate_ids(model, torch.tensor([source]), None, config)[0, 1:].tolist()


def _start(model: Any) -> int:
    return 0 if model.config.decoder_start_id is None else int(model.config.decoder_start_id)


# -- the slot batch ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(MODELS))
def test_rows_that_join_and_leave_decode_as_each_would_alone(name, tmp_path):
    model = MODELS[name](tmp_path)
    start, vocab = _start(model), min(model.config.source_vocab, 90)
    g = torch.Generator().manual_seed(1)
    sources = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in (5, 17, 3, 9, 1, 12)]
    lengths = [12, 4, 9, 7, 10, 5]  # rows end at different steps, so others move into slots
    expected = [_alone(model, s, n, start) for s, n in zip(sources, lengths, strict=True)]
    assert len({tuple(e) for e in expected}) == len(expected), "degenerate: rows agree"
    batch: EncoderDecoderSlots[int] = EncoderDecoderSlots(model, max_rows=3)
    got: dict[int, list[int]] = {}
    waiting, sizes = list(range(len(sources))), []
    with torch.inference_mode():
        while waiting or len(batch):
            joined = []
            while waiting and batch.free:  # a source joins while the others are mid-way
                i = waiting.pop(0)
                batch.open(i, sources[i])
                joined.append(i)
                got[i] = []
            running = [k for k in batch.keys if k not in joined]
            if running:  # the rows past their start token, then the new ones' start tokens
                sizes.append(len(batch))
                logits = batch.step(torch.tensor([got[k][-1] for k in running]), running)
                for key, row in zip(running, logits, strict=True):
                    got[key].append(int(row.argmax()))
            if joined:
                logits = batch.step(torch.tensor([start] * len(joined)), joined)
                for key, row in zip(joined, logits, strict=True):
                    got[key].append(int(row.argmax()))
            for key in [k for k in batch.keys if len(got[k]) == lengths[k]]:
                batch.remove(key)
    assert [got[i] for i in range(len(sources))] == expected
    assert max(sizes) == 3 and min(sizes) < 3, "the batch never filled or never drained"


@pytest.mark.parametrize("name", ["marian", "t5-relative-bias"])
def test_a_step_gives_the_logits_of_the_whole_target(name, tmp_path):
    model = MODELS[name](tmp_path)
    start = _start(model)
    rows = {"short": ([5, 6, 7], [start, 11, 12, 13]), "long": (list(range(4, 30)), [start, 9])}
    batch: EncoderDecoderSlots[str] = EncoderDecoderSlots(model, max_rows=2)
    with torch.inference_mode():
        for key, (source, _) in rows.items():
            batch.open(key, source)
        for key, (_, target) in rows.items():  # each row's target but its last token
            for token in target[:-1]:
                batch.step(torch.tensor([token]), [key])
        stepped = batch.step(torch.tensor([t[-1] for _, t in rows.values()]))  # both at once
        for row, (source, target) in enumerate(rows.values()):
            reference = model(torch.tensor([source]), torch.tensor([target]))[0, -1]
            torch.testing.assert_close(stepped[row], reference, atol=1e-4, rtol=1e-4)
    assert batch.length("short") == 4 and batch.source_length("long") == 26


def test_a_slot_batch_of_an_encoder_decoder_says_what_it_cannot_do():
    with pytest.raises(ValueError, match="not an encoder-decoder"):
        EncoderDecoderSlots(zoo.build("llama-tiny"), 2)
    model = zoo.build("transformer-encdec-tiny", vocab_size=300, context_length=16).eval()
    with pytest.raises(ValueError, match=r"max_len must be in \[1, 16\]"):
        EncoderDecoderSlots(model, 2, max_len=17)
    batch: EncoderDecoderSlots[int] = EncoderDecoderSlots(model, 1)
    with pytest.raises(ValueError, match="source ids"):
        batch.open(0, list(range(17)))
    with pytest.raises(ValueError, match="source ids"):
        batch.open(0, [300])
    with torch.inference_mode():
        batch.open(0, [5, 6])
        with pytest.raises(ValueError, match="all 1 slots are in use"):
            batch.open(1, [5])
        with pytest.raises(ValueError, match="one token per sequence"):
            batch.step(torch.tensor([1, 2]))
        for _ in range(16):
            batch.step(torch.tensor([2]))
        with pytest.raises(ValueError, match="fills its slot"):
            batch.step(torch.tensor([2]))
    assert check_encoder_decoder_batchable(model) is model


# -- the engine: requests of a Marian checkpoint ---------------------------------------------
#: An OPUS-MT generation_config.json: pad (0) starts the target and is never picked, the
#: end id closes a target that reaches max_length, four beams by default (not served).
GENERATION = {
    "bad_words_ids": [[0]], "decoder_start_token_id": 0, "eos_token_id": 3,
    "forced_eos_token_id": 3, "max_length": 40, "num_beams": 4, "pad_token_id": 0,
}  # fmt: skip


@pytest.fixture(scope="module")
def marian(tok, tmp_path_factory) -> Any:
    """A Marian folder with OPUS-MT's generation settings, the end id likelier than the rest
    (so that some targets end before max_tokens and others do not)."""
    folder = tmp_path_factory.mktemp("marian")
    model = _marian(folder, tok.vocab_size, tok.eos_id, GENERATION)
    with torch.no_grad():
        model.final_logits_bias[tok.eos_id] = 27.0
    return model


def _generate(model: Any, tok: Any, source: list[int], n: int, **sampling: Any) -> list[int]:
    """zoo.generate's target for ``source`` alone (greedy unless told), the start token
    left out: the checkpoint's settings apply (one beam, as serving decodes)."""
    sampling = {"temperature": 0, **sampling}
    out = zoo.generate(model, source, tokenizer=tok, max_new_tokens=n, num_beams=1, **sampling)
    assert out[0] == GENERATION["decoder_start_token_id"]
    return list(out[1:])


class Tracked(Request):
    """A request that keeps the tokens it is handed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokens: list[int] = []

    def take(self, token: int) -> bool:
        self.tokens.append(token)
        return super().take(token)


def test_requests_joining_at_different_steps_pick_generates_tokens(marian, tok):
    settings = source_settings(marian, tok)
    assert settings["start_id"] == 0 and settings["bad_words_ids"] == ((0,),)
    engine = Engine(marian, max_batch=3, max_queue=8)
    g = torch.Generator().manual_seed(3)
    sources = [torch.randint(4, 250, (n,), generator=g).tolist() for n in (6, 19, 2, 11, 8, 14)]
    lengths = [20, 6, 14, 25, 9, 30]
    seeds = [None, None, 11, None, 5, None]  # two sampled requests, each with its own seed
    requests, expected = [], []
    for source, n, seed in zip(sources, lengths, seeds, strict=True):
        sampling: dict[str, Any] = {"temperature": 0}
        if seed is not None:
            sampling = {"temperature": 0.8, "seed": seed}
        config = GenerationConfig(
            max_new_tokens=n, eos_id=tok.eos_id, vocab_limit=tok.vocab_size, **sampling
        )
        config = dataclasses.replace(config, **settings)
        requests.append(Tracked(source, config, TargetText(tok), Collect(), tok.end_ids))
        expected.append(_generate(marian, tok, source, n, **sampling))
    arrivals = {0: requests[:2], 1: requests[2:3], 3: requests[3:4], 4: requests[4:5]}
    with torch.inference_mode():
        for step in range(200):  # the later ones arrive while the first ones decode
            engine.submit(arrivals.get(step, []) if step != 6 else requests[5:])
            engine.step()
            if all(r.finished for r in requests):
                break
    assert [r.tokens for r in requests] == expected
    ended = [len(want) < n for want, n in zip(expected, lengths, strict=True)]
    assert any(ended) and not all(ended), "every target ended alike: the test proves less"
    for request, want in zip(requests, expected, strict=True):
        finish = request.emit.finish  # type: ignore[attr-defined]
        assert finish.reason == "stop" and want[-1] == tok.eos_id  # forced at the last one
        assert finish.prompt_tokens == len(request.prompt)  # the source's tokens
        assert finish.completion_tokens == len(want)
        text = tok.decode(want[:-1], skip_special_tokens=True)
        assert request.emit.text == text  # type: ignore[attr-defined]


# -- the HTTP application ---------------------------------------------------------------------
class App:
    """``create_app`` of an engine on ``model``, served by uvicorn in a thread on a free port,
    the engine's loop in a thread of its own."""

    def __init__(self, model: Any, tokenizer: Any, **engine: Any) -> None:
        self.engine = Engine(model, **{"max_batch": 2, "max_queue": 8, **engine})
        app = create_app(self.engine, tokenizer, model_id=MODEL)
        self.server, self.port, self.thread = serve_in_thread(app, Limits())
        self.engine.start()

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """Status and JSON body of one request (a stream's events as a list)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            data = json.dumps({"model": MODEL, **body})
            connection.request("POST", path, data, {"Content-Type": "application/json"})
            response = connection.getresponse()
            raw = response.read().decode()
        finally:
            connection.close()
        if not body.get("stream") or response.status != 200:
            return response.status, json.loads(raw)
        events = [line[6:] for line in raw.split("\n\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return response.status, [json.loads(e) for e in events[:-1]]

    def close(self) -> None:
        self.engine.stop()
        self.server.should_exit = True
        self.thread.join()


@pytest.fixture(scope="module")
def marian_app(marian, tok) -> Iterator[App]:
    app = App(marian, tok)
    yield app
    app.close()


def _expected(model: Any, tok: Any, text: str, n: int, **sampling: Any) -> dict[str, Any]:
    """What a completion of ``text`` must answer: zoo.generate's target of its source alone,
    as text (special tokens left out), its finish and its usage."""
    source = tok.encode(text)
    want = _generate(model, tok, source, n, **sampling)
    ended = want[-1] in tok.end_ids
    return {
        "text": tok.decode(want[:-1] if ended else want, skip_special_tokens=True),
        "finish_reason": "stop" if ended else "length",
        "usage": {"prompt_tokens": len(source), "completion_tokens": len(want),
                  "total_tokens": len(source) + len(want)},
    }  # fmt: skip


def test_concurrent_completions_are_each_sources_generate(marian_app, marian, tok):
    jobs = [(text, n, {}) for text, n in zip(TEXTS, (12, 30, 5, 21, 17), strict=True)]
    jobs.append((TEXTS[2], 25, {"temperature": 0.8, "seed": 3}))  # sampled, seeded
    expected = [_expected(marian, tok, text, n, **s) for text, n, s in jobs]
    assert len({e["text"] for e in expected}) > 3, "degenerate: the targets agree"

    def complete(job: tuple[str, int, dict[str, Any]]) -> tuple[int, Any]:
        text, n, sampling = job
        body = {"prompt": text, "max_tokens": n, "temperature": 0, **sampling}
        return marian_app.post("/v1/completions", body)

    with ThreadPoolExecutor(len(jobs)) as pool:  # two slots: the others queue and join later
        replies = list(pool.map(complete, jobs))
    for (status, reply), want in zip(replies, expected, strict=True):
        assert status == 200, reply
        choice = reply["choices"][0]
        assert {"text": choice["text"], "finish_reason": choice["finish_reason"],
                "usage": reply["usage"]} == want  # fmt: skip


def test_a_streamed_completion_sends_the_same_text_then_usage(marian_app, marian, tok):
    want = _expected(marian, tok, TEXTS[1], 30)
    status, events = marian_app.post(
        "/v1/completions",
        {"prompt": TEXTS[1], "max_tokens": 30, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert status == 200
    pieces = [e["choices"][0]["text"] for e in events if e["choices"]]
    assert len([p for p in pieces if p]) > 1, "the text came in one piece"
    assert "".join(pieces) == want["text"]
    assert events[-2]["choices"][0]["finish_reason"] == want["finish_reason"]
    assert events[-1]["usage"] == want["usage"]


def test_id_prompts_and_several_sources_in_one_request(marian_app, marian, tok):
    ids = [tok.encode(t) for t in TEXTS[:2]]
    want = [_expected(marian, tok, t, 9)["text"] for t in TEXTS[:2]]
    for prompt in (TEXTS[0], ids[0]):  # text, or its ids
        status, reply = marian_app.post(
            "/v1/completions", {"prompt": prompt, "max_tokens": 9, "temperature": 0}
        )
        assert status == 200 and reply["choices"][0]["text"] == want[0]
    for prompt in (TEXTS[:2], ids):  # several texts, or several id lists
        status, reply = marian_app.post(
            "/v1/completions", {"prompt": prompt, "max_tokens": 9, "temperature": 0}
        )
        assert status == 200
        assert [c["text"] for c in sorted(reply["choices"], key=lambda c: c["index"])] == want
        assert reply["usage"]["prompt_tokens"] == sum(len(i) for i in ids)


def test_what_an_encoder_decoder_cannot_serve_is_a_400(marian_app, tok):
    long_text = " ".join(TEXTS * 10)  # far more tokens than the 64 a source may have
    cases = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
         "no_chat_template", "messages"),
        ("/v1/completions", {"prompt": "hi", "num_beams": 4}, "unsupported_parameter",
         "num_beams"),
        ("/v1/completions", {"prompt": long_text}, "context_length_exceeded", "prompt"),
        ("/v1/completions", {"prompt": [list(range(4, 70))]}, "context_length_exceeded",
         "prompt"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 64}, "context_length_exceeded",
         "max_tokens"),
        ("/v1/completions", {"prompt": [5, tok.vocab_size]}, None, "prompt"),
        ("/v1/completions", {"prompt": "hi", "best_of": 3}, "unsupported_parameter", "best_of"),
    ]  # fmt: skip
    for path, body, code, param in cases:
        status, reply = marian_app.post(path, body)
        assert status == 400, (body, reply)
        error = reply["error"]
        assert (error["code"], error["param"]) == (code, param), error
    assert "source" in marian_app.post("/v1/completions", cases[2][1])[1]["error"]["message"]
    assert "beam search" in marian_app.post(*cases[1][:2])[1]["error"]["message"]
    status, _ = marian_app.post("/v1/completions", {"prompt": "hi", "num_beams": 1})
    assert status == 200  # one beam is what is served; and the server goes on


def test_chat_through_a_template_is_the_rendered_conversation_as_source(tok):
    model = MODELS["transformer-encdec"](None)
    templated = with_chat_template(tok, TEMPLATE)
    app = App(model, templated)
    try:
        messages = [{"role": "user", "content": TEXTS[4]}]
        status, reply = app.post(
            "/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0}
        )
        source = templated.encode(f"{TEXTS[4]}\n", allowed_special="all")
        want = zoo.generate(
            model, source, tokenizer=templated, max_new_tokens=8, temperature=0
        )  # starts with the tokenizer's <s>: the model names no start token
        assert want[0] == tok.bos_id and tok.eos_id not in want
        assert status == 200 and reply["choices"][0]["finish_reason"] == "length"
        text = tok.decode(want[1:], skip_special_tokens=True)
        assert reply["choices"][0]["message"]["content"] == text
        assert reply["usage"]["prompt_tokens"] == len(source)
        status, models = 0, app.post("/v1/completions", {"prompt": "x", "max_tokens": 48})
        assert models[0] == 400 and models[1]["error"]["param"] == "max_tokens"  # 48 positions
    finally:
        app.close()


def test_the_engine_refuses_what_it_cannot_do_for_an_encoder_decoder(tok):
    model = zoo.build("transformer-encdec-tiny", vocab_size=300, context_length=16)
    with pytest.raises(ValueError, match="merge the adapter"):
        Engine(model, adapters={"notes": object()})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="drop --compile"):
        Engine(model, compile=True)
    engine = Engine(model, max_batch=1)
    assert engine.encoder_decoder and engine.max_len == 16 and engine.prefix_cache_stats() is None


# -- zoo serve FOLDER -------------------------------------------------------------------------
def test_zoo_serve_serves_a_saved_encoder_decoder(tok, tmp_path):
    from test_serve import Server

    model = MODELS["transformer-encdec"](None)
    folder = zoo.save(model, tmp_path / "model", tokenizer=tok)
    server = Server(tmp_path / "server", str(folder), "--max-batch", "2")
    try:
        body = {"model": str(folder), "prompt": TEXTS[0], "max_tokens": 6, "temperature": 0}
        status, reply = server.request(
            "POST",
            "/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        loaded = zoo.load(folder)
        want = zoo.generate(loaded, TEXTS[0], max_new_tokens=6, temperature=0)
        assert status == 200 and reply["choices"][0]["text"] == want
        assert reply["usage"]["prompt_tokens"] == len(tok.encode(TEXTS[0]))
    finally:
        server.stop()
    assert sys.executable  # the child ran this interpreter
