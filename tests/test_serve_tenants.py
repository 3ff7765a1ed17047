"""The prefix cache tells no client about another's prompts: blocks are kept apart per API key
(a server takes several keys) and per request ``cache_salt``, as vLLM's ``cache_salt`` keeps
them; ``shared_prefix_cache`` shares them across keys again. Whether a prompt hit is read from
the cache's own counts (``/health``), never from a time."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from test_serve_stall import Local

import zoo
from zoo.cli import main
from zoo.serve.guard import Guard

NAME = "shakespeare-byte"
A, B = "sk-tenant-a", "sk-tenant-b"
PROMPT = list(range(65, 65 + 40))  # 40 ids: two whole blocks of 16 to share


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return zoo.load(NAME).eval()


@pytest.fixture
def serving(model) -> Iterator[Any]:
    servers: list[Local] = []

    def start(**app: Any) -> Local:
        servers.append(Local(model, model.tokenizer, model_id=NAME, **app))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


def hit(server: Local, key: str | None, **fields: Any) -> int:
    """The prompt tokens the prefix cache gave one completion of :data:`PROMPT`."""

    def hit_tokens() -> int:
        status, health = server.request("GET", "/health", key=key)
        assert status == 200, health
        return int(health["prefix_cache"]["hit_tokens"])

    before = hit_tokens()
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, **fields}
    status, reply = server.request("POST", "/v1/completions", body, key=key)
    assert status == 200, reply
    return hit_tokens() - before


def test_one_keys_prompts_are_never_another_keys_hits(serving):
    server = serving(api_keys=[A, B])
    assert hit(server, A) == 0
    assert hit(server, B) == 0, "B's first request hit the blocks A's prompt left"
    assert hit(server, A) == 32 and hit(server, B) == 32, "each key still hits its own"
    assert server.request("GET", "/health", key="sk-other")[0] == 401


def test_a_cache_salt_keeps_requests_of_one_key_apart(serving):
    server = serving(api_keys=[A])
    assert hit(server, A, cache_salt="alice") == 0
    assert hit(server, A) == 0 and hit(server, A, cache_salt="bob") == 0
    assert hit(server, A, cache_salt="alice") == 32
    status, body = server.request(
        "POST", "/v1/completions", {"model": NAME, "prompt": PROMPT, "cache_salt": ""}, key=A
    )
    assert status == 400 and body["error"]["param"] == "cache_salt", body


def test_a_cache_salt_works_without_keys(serving):
    server = serving()
    assert hit(server, None, cache_salt="s1") == 0
    assert hit(server, None, cache_salt="s2") == 0
    assert hit(server, None) == 0 and hit(server, None) == 32


def test_shared_prefix_cache_shares_across_keys_but_not_across_salts(serving):
    server = serving(api_keys=[A, B], shared_prefix_cache=True)
    assert hit(server, A) == 0
    assert hit(server, B) == 32, "a shared cache gives B the blocks of A's prompt"
    assert hit(server, B, cache_salt="own") == 0


def test_chat_requests_are_kept_apart_too(serving, folder_model):
    model, tok = folder_model
    server = Local(model, tok, api_keys=[A, B])
    try:
        messages = [{"role": "system", "content": "x" * 40}, {"role": "user", "content": "hi"}]
        body = {"model": "tiny-chat", "messages": messages, "max_tokens": 1}

        def chat_hits(key: str, **fields: Any) -> int:
            before = server.request("GET", "/health", key=key)[1]["prefix_cache"]["hit_tokens"]
            status, reply = server.request("POST", "/v1/chat/completions", {**body, **fields},
                                           key=key)  # fmt: skip
            assert status == 200, reply
            after = server.request("GET", "/health", key=key)[1]["prefix_cache"]["hit_tokens"]
            return int(after - before)

        assert chat_hits(A) == 0 and chat_hits(B) == 0 and chat_hits(A) > 0
        assert chat_hits(A, cache_salt="other") == 0
    finally:
        server.stop()


@pytest.fixture(scope="module")
def folder_model(tmp_path_factory) -> tuple[Any, Any]:
    from chat_folders import write_folder

    import zoo.tokenizers

    folder = write_folder(tmp_path_factory.mktemp("tenants") / "tokenizer", "qwen2.5-instruct")
    tok = zoo.tokenizers.load_folder(folder)
    torch.manual_seed(0)
    return zoo.build("llama-tiny", vocab_size=tok.vocab_size, context_length=512).eval(), tok


def test_the_guard_takes_several_keys_and_checks_each():
    async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
        raise AssertionError

    with pytest.raises(ValueError, match="printable ASCII"):
        Guard(app, api_keys=[A, "sk-\u00e9"], max_body_bytes=10)
    with pytest.raises(ValueError, match="twice"):
        Guard(app, api_keys=[A, A], max_body_bytes=10)
    assert Guard(app, api_keys=[A, B], max_body_bytes=10).keys == 2


def test_serve_takes_several_keys_from_flags_and_a_file(tmp_path, capsys):
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# one key a line\n{A}\n\n{B}\n")
    from zoo.cli.serve import api_keys

    def args(flags: list[str], files: list[str]) -> argparse.Namespace:
        return argparse.Namespace(api_key=flags, api_key_file=files)

    assert api_keys(args(["sk-flag"], [str(keys)]), None) == ["sk-flag", A, B]
    assert api_keys(args([], []), "sk-env") == ["sk-env"]
    assert api_keys(args([], []), None) == []
    keys.write_text("# no key at all\n")
    with pytest.raises(ValueError, match="no key"):
        api_keys(args([], [str(keys)]), None)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--api-key-file" in out and "--shared-prefix-cache" in out
