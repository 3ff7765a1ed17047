"""The one incremental detokeniser (zoo.generation.detokenize.TextStream), which zoo.generate's
streams, zoo chat and zoo serve share: its pieces join to the full decode of the new tokens
after their prompt, cut at the first stop string, on real tokenizers (tiktoken's GPT-2, a
WordPiece, a byte-level BPE, a SentencePiece-style BPE with byte fallback), and it decodes
O(n) characters for n tokens, whatever the tokens (counted, not timed)."""

from __future__ import annotations

import functools
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zoo
from zoo.generation.detokenize import MAX_PENDING, TextStream, cut_at_stop


class _Library:
    """A ``tokenizers`` library tokenizer seen through ``encode``/``decode`` of ids; random
    ids are drawn from ``first_random_id`` on."""

    def __init__(self, library: Any, first_random_id: int = 0) -> None:
        self.library = library
        self.vocab_size = library.get_vocab_size()
        self.first_random_id = first_random_id

    def encode(self, text: str) -> list[int]:
        return list(self.library.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.library.decode(ids, skip_special_tokens=False))


def _sentencepiece_style() -> _Library:
    """Llama's decoder (``▁`` for spaces, byte fallback, the first leading space stripped):
    a suffix of the ids decodes without the space its text has inside the whole. Its random
    ids are words (the byte tokens come from encoded text): ``ByteFallback`` turns every byte
    of a run that is not UTF-8 into U+FFFD, the valid ones before the bad byte included, so
    text sent before a bad byte arrives would change, which no stream can take back."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = ["<unk>", *(f"<0x{b:02X}>" for b in range(256)), "▁"]
    pieces += [f"▁{w}" for w in ("the", "a", "hello", "world", "é")] + ["lo", "wor", "ld", "s"]
    library = Tokenizer(
        models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], byte_fallback=True)
    )
    library.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    library.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return _Library(library, first_random_id=len(pieces) - 10)


@functools.cache
def tokenizer(name: str) -> Any:
    if name == "byte-level-bpe":
        from zoo.tokenizers.subword import SubwordBPE

        text = "hello world, the quick brown fox jumps; héllo wörld 中文 ünïcode\n"
        return SubwordBPE.train([text] * 20, 320)
    if name == "sentencepiece-style":
        return _sentencepiece_style()
    return zoo.tokenizer(name)


TOKENIZERS = ["gpt2-124m", "wiki-gpt-wordpiece", "byte-level-bpe", "sentencepiece-style"]


def full_text(tok: Any, context: list[int], new: list[int], stops: tuple[str, ...]) -> str:
    """The reference: the whole sequence decoded at once, less the context's text, cut at
    the first stop string."""
    head = tok.decode(context) if context else ""
    whole = tok.decode(context + new)
    assert whole.startswith(head)
    return cut_at_stop(whole[len(head) :], stops)[0]


def streamed(tok: Any, context: list[int], new: list[int], stops: tuple[str, ...]) -> list[str]:
    stream = TextStream(tok, context, stops)
    pieces = [stream.push(t) for t in new]
    return [p for p in [*pieces, stream.finish()] if p]


@st.composite
def cases(draw: st.DrawFn, name: str) -> tuple[list[int], list[int], tuple[str, ...]]:
    """A context (a text's ids, or none), new tokens (random ids, a text's ids split
    anywhere, or both) and stop strings (some from the new text, so they hit)."""
    tok = tokenizer(name)
    texts = st.text(alphabet=st.sampled_from(string.ascii_letters + " ,.'\né中文ü🙂"), max_size=24)
    context = tok.encode(draw(texts)) if draw(st.booleans()) else []
    ids = st.lists(st.integers(getattr(tok, "first_random_id", 0), tok.vocab_size - 1), max_size=24)
    new = draw(
        st.one_of(
            ids,
            texts.map(tok.encode),
            st.tuples(ids, texts).map(lambda pair: pair[0] + tok.encode(pair[1])),
        )
    )
    text = full_text(tok, context, new, ())
    stops: list[str] = draw(st.lists(st.text(min_size=1, max_size=3), max_size=2))
    if text and draw(st.booleans()):
        start = draw(st.integers(0, len(text) - 1))
        stops.append(text[start : start + draw(st.integers(1, 4))])
    return context, new, tuple(stops)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_pieces_join_to_the_full_decode_cut_at_the_first_stop(name):
    tokenizer(name)  # load outside hypothesis' deadline

    @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(cases(name))
    def check(case: tuple[list[int], list[int], tuple[str, ...]]) -> None:
        context, new, stops = case
        tok = tokenizer(name)
        assert "".join(streamed(tok, context, new, stops)) == full_text(tok, context, new, stops)

    check()


class _Counting:
    """Counts the ids and characters a tokenizer decodes."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.ids = self.chars = 0

    def decode(self, ids: list[int]) -> str:
        text = self.tok.decode(ids)
        self.ids += len(ids)
        self.chars += len(text)
        return text


@pytest.mark.parametrize(
    "data",
    [
        "To be, or not to be, that is the question: héllo 中文 🙂. ".encode() * 40,
        b"\xff" * 500,  # bytes that never form a character: U+FFFD for good
        "中".encode() * 300,  # every character split across three byte tokens
    ],
)
def test_the_decoding_is_linear_in_the_reply(data):
    """A window per token, never the whole reply: n tokens decode O(n) ids and characters
    (the streaming of zoo.generate re-decoded everything at each token: n^2 / 2)."""
    byte = zoo.tokenizer("byte")
    new, context = list(data), byte.encode("ROMEO:")
    counting = _Counting(byte)
    pieces = streamed(counting, context, new, ("xyz",))
    assert "".join(pieces) == full_text(byte, context, new, ("xyz",))
    bound = 4 * (MAX_PENDING + 2) * len(new)
    assert counting.ids <= bound and counting.chars <= bound, (counting.ids, counting.chars)


def test_a_character_completed_after_bytes_that_never_form_one():
    """Bytes that stay U+FFFD are settled once MAX_PENDING tokens wait, but not the last
    three: a character they start can still complete."""
    byte = zoo.tokenizer("byte")
    new = [255] * (3 * MAX_PENDING) + list("中".encode()) + [255, 97]
    assert "".join(streamed(byte, [97], new, ())) == byte.decode(new)
    assert byte.decode(new).endswith("\ufffd" * 3 * MAX_PENDING + "中\ufffda")
