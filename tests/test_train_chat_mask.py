"""The reply mask of chat fine-tuning (zoo.tokenizers.chat_replies) placed fast and exactly:
each token is placed by decoding the ids before it, as it always was, but the ids are checked
once per conversation (not at every probe of the binary search), and a tokenizer that gives
each id's bytes (the byte tokenizer, tiktoken) decodes a prefix as a slice of bytes (those
decodes were once over half of the time before step 1). The masks equal the old
algorithm's, kept here as the reference, on drawn texts and conversations."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from chat_folders import write_folder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zoo
import zoo.tokenizers.base as base
from zoo.tokenizers import with_chat_template
from zoo.tokenizers.byte import ByteTokenizer
from zoo.tokenizers.chat_replies import reply_mask, reply_spans, reply_tokens

DATA = Path(__file__).parents[1] / "plugins" / "shakespeare" / "data"
BYTE_TEMPLATE = (DATA / "chat_template.jinja").read_text()
#: ChatML without {% generation %} markers: replies found by prefix renders.
PLAIN = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: gpt2 has one special token: the turns end with it.
GPT2_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}{{ eos_token }}"
    "{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def old_reply_mask(tokenizer: Any, ids: Sequence[int], text: str, spans: Any) -> list[int]:
    """The mask as zoo computed it before the ids were checked once: every probe decodes its prefix
    through Tokenizer.decode (the reference the fast path must equal, bit for bit)."""

    @functools.cache
    def decoded(count: int) -> str:
        return str(tokenizer.decode(list(ids[:count])))

    assert decoded(len(ids)) == text

    def start(i: int) -> int:
        before = decoded(i)
        return len(before) if text.startswith(before) else len(before) - 1

    def end(i: int) -> int:
        return len(decoded(i + 1))

    mask = [0] * len(ids)
    positions = range(len(ids))
    for low, high in spans:
        first = bisect.bisect_right(positions, low, key=end)
        stop = bisect.bisect_left(positions, high, key=start)
        mask[first:stop] = [1] * max(0, stop - first)
    return mask


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The byte tokenizer, gpt2's tiktoken BPE (real merges) and a tokenizers-library
    byte-level BPE with ChatML's added tokens (Qwen2.5's), each with a chat template."""
    folder = write_folder(tmp_path_factory.mktemp("qwen"), "qwen2.5-instruct", template=PLAIN)
    return {
        "byte": with_chat_template(ByteTokenizer(), BYTE_TEMPLATE),
        "byte-plain": with_chat_template(ByteTokenizer(), PLAIN.replace("<|im_end|>", "\0")),
        "gpt2": with_chat_template(zoo.tokenizer("gpt2"), GPT2_TEMPLATE),
        "qwen": zoo.tokenizer(str(folder)),
    }


#: Text that puts multi-byte characters, U+FFFD itself and special-token strings where a
#: token or a span may cut them.
PIECES = st.sampled_from(
    ["a", " the", "\n", "é", "☃", "🎭", "\ufffd", "ﬁ", "<|endoftext|>", "<|im_end|>", "  ", "ab"]
)
TEXTS = st.lists(st.one_of(PIECES, st.text(max_size=4)), max_size=24).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS, cuts=st.lists(st.integers(0, 200), max_size=6), name=st.sampled_from(
    ["byte", "gpt2", "qwen"]))  # fmt: skip
def test_the_mask_of_any_text_and_spans_is_the_old_algorithm_s(tokenizers, text, cuts, name):
    tok = tokenizers[name]
    ids = tok.encode(text, allowed_special="all")
    if tok.decode(ids) != text:  # (a text the tokenizer cannot give back is refused alike)
        return
    cuts = sorted(min(c, len(text)) for c in cuts)
    spans = list(zip(cuts[::2], cuts[1::2], strict=False))
    assert reply_mask(tok, ids, text, spans) == old_reply_mask(tok, ids, text, spans)


ROLES = st.sampled_from(["user", "assistant", "assistant", "system"])
MESSAGES = st.lists(st.fixed_dictionaries({"role": ROLES, "content": TEXTS}), max_size=6)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=MESSAGES, name=st.sampled_from(["byte", "byte-plain", "gpt2", "qwen"]))
def test_drawn_conversations_get_the_old_algorithm_s_ids_and_mask(tokenizers, messages, name):
    tok = tokenizers[name]
    try:
        text, spans, _ = reply_spans(tok._chat, messages)
    except zoo.tokenizers.ChatTemplateError:
        return  # (a content that ends with the generation prompt's text, say)
    ids = tok.encode(text, allowed_special="all")
    if tok.decode(ids) != text:
        return
    replies = reply_tokens(tok, messages)
    assert replies.ids == ids
    assert replies.mask == old_reply_mask(tok, ids, text, spans)


@pytest.mark.parametrize("name", ["byte", "gpt2", "qwen"])
def test_ids_are_checked_once_not_at_every_probe(tokenizers, name, monkeypatch):
    """Before: each of the ~2 log2(n) probes per reply decoded its prefix through
    Tokenizer.decode, which checks every id in Python (79 checks of up to 700 ids here on the
    byte tokenizer). Now reply_tokens checks none (its ids come from encode) and reply_mask
    checks once."""
    tok = tokenizers[name]
    checks: list[int] = []
    real = base.check_ids
    monkeypatch.setattr(base, "check_ids", lambda *a: checks.append(1) or real(*a))
    messages = [
        {"role": role, "content": f"turn {k} é ☃ " * 20}
        for k, role in enumerate(["user", "assistant"] * 4)
    ]
    replies = reply_tokens(tok, messages)
    assert sum(replies.mask) > 0
    assert len(checks) == 0, len(checks)
    text, spans, _ = reply_spans(tok._chat, messages)
    reply_mask(tok, replies.ids, text, spans)
    assert len(checks) == 1, len(checks)


def test_a_conversation_ending_with_a_reply_is_not_rendered_whole_twice(tokenizers, monkeypatch):
    """Without markers each reply costs two renders (the messages before it with the
    generation prompt, and up to it); the last reply's second render is the whole
    conversation, rendered already (before: 1 + 2 x 3 = 7 renders here, now 6)."""
    from zoo.tokenizers.chat import ChatTemplate

    renders: list[int] = []
    real = ChatTemplate.render
    monkeypatch.setattr(ChatTemplate, "render", lambda *a, **k: renders.append(1) or real(*a, **k))
    tok = tokenizers["qwen"]
    messages = [
        {"role": r, "content": f"{r} {k} é"} for k, r in enumerate(["user", "assistant"] * 3)
    ]
    text, spans, marked = reply_spans(tok._chat, messages)
    assert (
        not marked and len(spans) == 3 and text.endswith(messages[-1]["content"] + "<|im_end|>\n")
    )
    assert len(renders) == 6, len(renders)


def test_an_id_the_ranks_leave_out_is_refused_as_decode_refuses_it():
    """tiktoken ids between the ranks and the special tokens are no tokens: placing them
    says so as decode does (a TokenizerError, not the library's KeyError)."""
    import tiktoken

    from zoo.tokenizers import TokenizerError
    from zoo.tokenizers.tiktoken_backend import TiktokenTokenizer

    ranks = {bytes([i]): i for i in range(256)}
    encoding = tiktoken.Encoding("holes", pat_str=r"\S+|\s+", mergeable_ranks=ranks,
                                 special_tokens={"<|end|>": 300})  # fmt: skip
    tok = TiktokenTokenizer(encoding, name="holes")
    with pytest.raises(TokenizerError, match="id 270 is not a token of holes"):
        reply_mask(tok, [104, 270], "h<|end|>", [(0, 1)])
    assert reply_mask(tok, [104, 300], "h<|end|>", [(0, 1)]) == [1, 0]
