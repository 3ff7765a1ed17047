"""Long text of any shape is encoded in pieces cut where no token can cross: the
pieces give exactly the ids of one unchunked encode, for every backend, and memory
stays bounded for text split by newlines, tabs, runs of spaces, or no whitespace at all.
Training a tokenizer on such text is bounded too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from zoo.tokenizers import chunking

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [
    "the encoder reads the source sentence",
    "der Kodierer liest den Quellsatz",
    "attention is all you need, don't you think? 42 times!",
    "Aufmerksamkeit ist alles,\twas man braucht\n\n  oder?",
] * 20
UNIT = "The quick brown fox, 42 times, jumps over the lazy dog; Zoe's cafe! "
#: Text shapes: words apart by one space, a newline, two spaces, a tab, or nothing.
SHAPES = {"space": " ", "lines": "\n", "double": "  ", "tabs": "\t", "none": ""}


def shaped(shape: str, chars: int) -> str:
    sep = SHAPES[shape]
    unit = sep.join(UNIT.split()) + sep
    return unit * (chars // len(unit))


def _llama_like():
    """A SentencePiece-style BPE: ``Prepend("▁")`` and no pre-tokenizer, as Llama's
    tokenizer.json. Cutting its text anywhere changes the ids (each piece gets a "▁")."""
    import tokenizers
    from tokenizers import models, normalizers, trainers

    from zoo.tokenizers import HFTokenizer

    library = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    library.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    library.train_from_iterator(TEXTS, trainer=trainer)
    return HFTokenizer(library, name="llama-like", roles={"unk": "<unk>", "bos": "<s>"})


def _cl100k_like():
    """GPT-2's ranks under cl100k's split pattern (digits in threes, punctuation that takes
    the newlines after it): a pattern the cuts are not proven for, so never cut."""
    import tiktoken

    from zoo.tokenizers import TiktokenTokenizer

    gpt2 = zoo.tokenizer("gpt2-124m")
    pattern = (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++"""
        r"""[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
    )
    encoding = tiktoken.Encoding(
        name="cl100k-like",
        pat_str=pattern,
        mergeable_ranks=gpt2.encoding._mergeable_ranks,
        special_tokens={"<|endoftext|>": 50256},
    )
    return TiktokenTokenizer(encoding, name="cl100k-like", roles={"eos": "<|endoftext|>"})


@pytest.fixture(scope="module")
def every_backend(tmp_path_factory):
    from zoo.tokenizers.subword import SubwordBPE

    gpt1_dir = tmp_path_factory.mktemp("gpt1")
    data = Path(__file__).parent / "data" / "gpt1"
    (gpt1_dir / "vocab.json").write_bytes((data / "encoder_bpe_40000.json").read_bytes())
    (gpt1_dir / "merges.txt").write_bytes((data / "vocab_40000.bpe").read_bytes())
    return [
        zoo.tokenizer("wiki-gpt-wordpiece"),
        zoo.tokenizer("gpt1", directory=gpt1_dir),
        SubwordBPE.train(TEXTS, 300),
        zoo.tokenizer("gpt2-124m"),
        zoo.tokenizer("byte"),
        _llama_like(),
        _cl100k_like(),
    ]


def _whole(tok, text: str, allowed: bool) -> list[int]:
    """The ids of one unchunked call into the library."""
    if tok.backend == "tokenizers":
        library = tok.tokenizer if allowed else tok._as_text
        return library.encode(text, add_special_tokens=False).ids
    if tok.backend == "tiktoken":
        if allowed:
            return tok.encoding.encode(text, allowed_special="all")
        return tok.encoding.encode(text, disallowed_special=())
    return tok.encode(text, allowed_special="all" if allowed else False)  # byte: exact by design


ALPHABET = [
    *"ab cé,.!'st\n\t\r  Zé中😀_-0123456789",
    "[SEP]",
    "<s>",
    "<|endoftext|>",
    "\u0301",  # a combining accent
    "\u3000",  # ideographic space
    "\x1c",  # a separator Python calls whitespace and BERT removes
    "\x0b",
    "don't",
    "'ll",
    "  \n",
]


@settings(max_examples=120, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(ALPHABET) | st.characters(exclude_categories=("Cs",)), max_size=80
    ).map("".join),
    allowed=st.booleans(),
)
def test_pieces_give_the_ids_of_the_whole_text(every_backend, text, allowed, monkeypatch_module):
    """With pieces of 3 characters, every backend's encode and iter_encode give exactly the
    ids one unchunked library call gives."""
    for tok in every_backend:
        whole = _whole(tok, text, allowed)
        special = "all" if allowed else False
        assert tok.encode(text, allowed_special=special) == whole, (tok.name, text)
        streamed = [i for ids in tok.iter_encode(text, allowed_special=special) for i in ids]
        assert streamed == whole, (tok.name, text)


@pytest.fixture(scope="module")
def monkeypatch_module():
    """Pieces of 3 characters, 2 at a time, for the whole module's property test."""
    import zoo.tokenizers.byte as byte
    import zoo.tokenizers.hf_backend as hf
    import zoo.tokenizers.tiktoken_backend as tt

    mp = pytest.MonkeyPatch()
    mp.setattr(hf, "CHUNK_CHARS", 3)
    mp.setattr(hf, "CHUNKS_AT_ONCE", 2)
    mp.setattr(tt, "CHUNK_CHARS", 3)
    mp.setattr(byte, "CHUNK_CHARS", 3)
    yield
    mp.undo()


def test_which_tokenizers_are_cut(every_backend):
    import zoo.tokenizers.tiktoken_backend as tt

    rules = {tok.name: tok._cut[0] for tok in every_backend if tok.backend == "tokenizers"}
    assert rules == {
        "bert-wordpiece-uncased": chunking.CUT_WORDS,
        "gpt1-bpe": chunking.CUT_WORDS,
        "subword-bpe": chunking.CUT_WORDS,
        "llama-like": None,
    }
    gpt2, cl100k = every_backend[3], every_backend[6]
    assert gpt2.encoding._pat_str in tt._GPT2_PATTERNS
    assert cl100k.encoding._pat_str not in tt._GPT2_PATTERNS


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_text_of_every_shape_is_cut_into_bounded_pieces(shape):
    text = shaped(shape, 200_000)
    parts = list(chunking.pieces(text, 1000, chunking.CUT_WORDS))
    assert "".join(parts) == text
    assert len(parts) > 150 and max(map(len, parts)) <= 1100, (len(parts), max(map(len, parts)))


def test_no_cut_falls_inside_a_special_token():
    text = "ab<|endoftext|>cd" * 10
    for size in range(1, 20):
        for part in chunking.pieces(text, size, chunking.CUT_WORDS, ["<|endoftext|>"]):
            assert part.count("<") == part.count(">"), part
        for part in chunking.pieces(text, size, chunking.CUT_ANYWHERE, ["<|endoftext|>"]):
            assert part.count("<") == part.count(">"), part


PEAK_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    sys.path.insert(0, sys.argv[3])
    import zoo
    from test_tokenizer_memory import shaped
    tok = zoo.tokenizer(sys.argv[1])
    text = shaped(sys.argv[2], 5_000_000)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ids = tok.encode(text)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"grew_mb": (peak - base) / 1024, "tokens": len(ids)}))
    """
)


@pytest.mark.parametrize("shape", ["lines", "double", "tabs", "none"])
def test_wordpiece_memory_is_bounded_for_every_shape(shape):
    """5 MB of WordPiece text grew the process by 540-680 MB when its words were apart by
    anything but single spaces (one piece); in pieces it grows by the ids and little more."""
    out = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, "wiki-gpt-wordpiece", shape, str(ROOT / "tests")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["tokens"] > 1_000_000
    assert result["grew_mb"] < 200, result


# Training a tokenizer: 20 MB of text with double spaces once took 2.9 GB, a
# run of letters without a break took time in the square of its length, and text of distinct
# words (random words, random Unicode) took the trainer ~100-120 bytes per byte.


def _library_trained(texts: list[str], vocab_size: int) -> str:
    """tokenizer.json of the library's own training on ``texts``, pre-tokenized whole: what
    SubwordBPE.train did before it cut texts and bounded words."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from zoo.tokenizers.subword import SPECIAL_TOKENS

    library = tokenizers.Tokenizer(models.BPE())
    library.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    library.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    library.train_from_iterator(texts, trainer=trainer)
    return library.to_str()


@settings(max_examples=40, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(ALPHABET) | st.characters(exclude_categories=("Cs",)), max_size=200
    ).map("".join),
)
def test_training_learns_what_the_whole_text_teaches(text):
    """Cut into pieces of 3 characters, words bounded, lines dropped or not: the same
    tokenizer.json as the library trained on the whole text, or on its lines and columns."""
    import zoo.tokenizers.subword as subword

    texts = [text * 3, text]
    columns = [part for t in texts for line in t.splitlines() for part in line.split("\t")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subword, "TRAIN_PIECE_CHARS", 3)
        trained = subword.SubwordBPE.train(texts, 300).tokenizer.to_str()
        assert trained == _library_trained(texts, 300)
        trained = subword.SubwordBPE.train(iter(texts), 300, split_lines=True).tokenizer.to_str()
        assert trained == _library_trained(columns, 300)


def test_training_words_are_bounded():
    """A run of 1,000 letters (or spaces, digits, marks) reaches the trainer as words of at
    most MAX_WORD_CHARS; encoding still splits words as GPT-2 does."""
    from zoo.tokenizers.subword import MAX_WORD_CHARS, SubwordBPE, _training_pre_tokenizer

    pre = _training_pre_tokenizer(split_lines=False)
    for run in ["a" * 1000, " " * 1000 + "b", "7" * 1000, "!" * 1000]:
        words = [word for word, _ in pre.pre_tokenize_str(run)]
        assert max(map(len, words)) <= MAX_WORD_CHARS + 1, (run[:5], list(map(len, words)))
        assert len("".join(words)) == len(run.encode())
    tok = SubwordBPE.train(["a" * 1000], 300)
    assert tok.tokenizer.pre_tokenizer.pre_tokenize_str("a" * 1000)[0][0] == "a" * 1000
    assert tok.decode(tok.encode("a" * 1000)) == "a" * 1000


def test_training_stops_at_the_distinct_words_budget():
    """Reading stops, with a warning that says where and how to go further, before the
    distinct words pass max_distinct_bytes; below it nothing is said and nothing left out."""
    from zoo.tokenizers import TokenizerError
    from zoo.tokenizers.subword import SubwordBPE

    texts = [f"word{i} and more words" for i in range(2000)]
    with pytest.warns(UserWarning, match=r"first [\d,]+ characters.*max_distinct_bytes=2,000"):
        small = SubwordBPE.train(iter(texts), 400, max_distinct_bytes=2_000)
    whole = SubwordBPE.train(texts, 400, max_distinct_bytes=None)
    assert small.vocab_size < whole.vocab_size
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bounded = SubwordBPE.train(texts, 400)
    assert bounded.tokenizer.to_str() == whole.tokenizer.to_str()
    for bad in [0, -1, 1.5, True, "2MB"]:
        with pytest.raises(TokenizerError, match="max_distinct_bytes must be"):
            SubwordBPE.train(texts, 400, max_distinct_bytes=bad)


def test_zoo_train_passes_its_budget_and_its_warning_names_the_flag(tmp_path):
    """``zoo train --tokenizer-max-distinct`` reaches the trainer (through train_tokenizer),
    and the warning names that flag, so a command-line user can go further."""
    from zoo.train import train_tokenizer

    data = tmp_path / "data.txt"
    data.write_text("".join(f"word{i} and more words\n" for i in range(2000)))
    with pytest.warns(UserWarning, match="zoo train --tokenizer-max-distinct"):
        small = train_tokenizer(data, 400, 2_000)
    assert small.vocab_size < train_tokenizer(data, 400).vocab_size


def test_runs_of_whitespace_count_against_the_budget():
    """Runs of mixed whitespace are words to the trainer too: distinct ones count."""
    import random

    from zoo.tokenizers.subword import SubwordBPE

    rng = random.Random(0)
    spaces = [" ", "\u3000", "\xa0", "\u2002", "\t", "\n"]
    texts = ["x" + "".join(rng.choices(spaces, k=12)) + "y" for _ in range(500)]
    with pytest.warns(UserWarning, match="max_distinct_bytes=5,000"):
        SubwordBPE.train(texts, 300, max_distinct_bytes=5_000)


#: Trains on 1.5 MB of double spaces on one line and 600,000 letters without a break, with
#: 256 MB of address space beyond what the process holds once its imports and text are in
#: (the trainer's threads and their malloc arenas reserve ~120 MB of it).
TRAIN_CHILD = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, sys.argv[1])
    from zoo.tokenizers.subword import SubwordBPE
    from test_tokenizer_memory import shaped
    texts = [shaped("double", 1_500_000), "".join(chr(97 + i * i % 26) for i in range(600_000))]
    status = open("/proc/self/status").read()
    held = int(status.split("VmSize:")[1].split()[0]) << 10
    resource.setrlimit(resource.RLIMIT_AS, (held + (256 << 20), held + (256 << 20)))
    print(SubwordBPE.train(texts, 2000).vocab_size, held >> 20)
    """
)


def test_training_on_hostile_text_stays_bounded():
    """1.5 MB on one line with double spaces took 417 MB of address space in all (360 MB
    more than the process held before training; now 175 MB in all), and 300,000 letters
    without a break took 34 s (600,000 here: over 60 s); both train in a second now."""
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "RAYON_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", TRAIN_CHILD, str(ROOT / "tests")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[0]) > 300, out.stdout  # merges learnt
