"""The three fixed-vocabulary tokenizers against their references, token for token.

- gpt2-bpe vs the real ``tiktoken.get_encoding("gpt2")``. With no network, tiktoken's download
  is replaced by its cache: the original ``vocab.bpe`` and ``encoder.json`` are rebuilt from the
  shipped ranks and placed in ``TIKTOKEN_CACHE_DIR``; tiktoken checks their sha256 against the
  hashes it pins, so the reference is tiktoken's own loader on the original files.
- gpt1-bpe vs ``transformers.OpenAIGPTTokenizer`` on the original files, vendored in
  ``tests/data/gpt1``.
- bert-wordpiece-uncased vs ``transformers.BertTokenizerFast`` on the shipped vocabulary.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo

GPT1_REFERENCE = Path(__file__).parent / "data" / "gpt1"  # vendored, see its README.md
GPT1_VOCAB = GPT1_REFERENCE / "encoder_bpe_40000.json"
GPT1_MERGES = GPT1_REFERENCE / "vocab_40000.bpe"

#: Hand-picked text that exercises every stage: case, accents, punctuation runs, numbers,
#: contractions, whitespace runs and newlines, control characters, CJK, emoji, symbols, long
#: words, special-token strings, code and URLs.
CORPUS = [
    "Hello world",
    "Hello world! Every effort moves you",
    "Every effort moves you",
    "",
    " ",
    "   leading and trailing spaces   ",
    "The quick brown fox jumps over the lazy dog.",
    "I can't believe it's not butter; they'd've known, wouldn't they?",
    "Numbers: 0 7 42 1,234,567.89 3.14159e-10 -17 +5 1/2 2024-05-01 12:30pm #1",
    "Punctuation!!! ... ?!?! --- (parens) [brackets] {braces} <angles> \"quotes\" 'single'",
    "«guillemets» — em dash – en dash … ellipsis ´acute´ “curly” ‘quotes’",
    "Ünïcödé àccénts: café naïve façade São Paulo Zürich Ærøskøbing",
    "Ελληνικά κείμενα και русский текст, עברית, العربية",
    "中文文本和日本語のテキスト、한국어 텍스트",
    "emoji 😀🎉👍🏽 and flags 🇫🇷 and zwj 👩‍👩‍👧",
    "line one\nline two\r\nline three\n\n\nafter blank lines",
    "tabs\tand\tvertical\x0bfeed\x0cform and nbsp\u00a0here and ideographic\u3000space",
    "control \x00 null \x1f unit sep \u200b zero width \ufeff bom",
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "a" * 300,
    "x" + "yz" * 150 + " end",
    "def f(x):\n    return x ** 2  # square\n",
    "https://example.com/path?query=1&b=two#frag user@example.org",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "[CLS] [SEP] [PAD] [UNK] [MASK] <unk>",
    "MiXeD CaSe WORDS and ALLCAPS",
    "ﬁ ligature, ½ fraction, ² superscript, Ⅻ roman numeral, ℌ",
    "\u0301 combining acute alone, e\u0301 decomposed",
    "word" + "\u0300" * 20,
]


# -- gpt2-bpe ----------------------------------------------------------------------------------
GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


def _data_gym_files(ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """Rebuild GPT-2's original ``vocab.bpe`` and ``encoder.json`` from tiktoken ranks.

    A merge's two halves are what BPE with the lower ranks makes of the merged token; the
    result is only trusted because it hashes to tiktoken's pinned sha256 (checked by caller).
    """
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    to_char = {b: chr(b) for b in printable}
    to_char.update(
        {b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in printable)}
    )

    def text(token: bytes) -> str:
        return "".join(to_char[b] for b in token)

    def halves(token: bytes, rank: int) -> list[bytes]:
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            pairs = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
            _, i = min(pairs)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return parts

    ordered = sorted(ranks.items(), key=lambda item: item[1])
    merges = [" ".join(map(text, halves(token, rank))) for token, rank in ordered[256:]]
    vocab_bpe = ("#version: 0.2\n" + "\n".join(merges) + "\n").encode()
    encoder = {text(token): rank for token, rank in ordered}
    encoder["<|endoftext|>"] = 50256
    return vocab_bpe, json.dumps(encoder).encode()


@pytest.fixture(scope="module")
def gpt2() -> zoo.tokenizers.Tokenizer:
    return zoo.tokenizer("gpt2-124m")


@pytest.fixture(scope="module")
def tiktoken_gpt2(gpt2, tmp_path_factory):
    """The real ``tiktoken.get_encoding("gpt2")``, loaded from a seeded cache, no network."""
    import tiktoken
    import tiktoken.load
    import tiktoken.registry

    vocab_bpe, encoder_json = _data_gym_files(gpt2.encoding._mergeable_ranks)
    assert hashlib.sha256(vocab_bpe).hexdigest() == VOCAB_BPE_SHA256
    assert hashlib.sha256(encoder_json).hexdigest() == ENCODER_JSON_SHA256
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    for name, data in (("vocab.bpe", vocab_bpe), ("encoder.json", encoder_json)):
        (cache / hashlib.sha1((GPT2_URL + name).encode()).hexdigest()).write_bytes(data)

    def no_network(blobpath: str) -> bytes:
        raise AssertionError(f"tiktoken tried to download {blobpath}: the cache was not used")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        mp.setattr(tiktoken.load, "read_file", no_network)
        mp.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
        encoding = tiktoken.get_encoding("gpt2")
        mp.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    return encoding


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("Hello world", [15496, 995]),
        ("Every effort moves you", [6109, 3626, 6100, 345]),
        ("<|endoftext|>", [50256]),
    ],
)
def test_gpt2_known_ids(gpt2, text, ids):
    assert gpt2.encode(text, allowed_special="all") == ids
    assert gpt2.decode(ids) == text


def test_gpt2_shape(gpt2, tiktoken_gpt2):
    assert gpt2.vocab_size == tiktoken_gpt2.n_vocab == 50257
    assert gpt2.eos_id == gpt2.bos_id == tiktoken_gpt2.eot_token == 50256
    assert gpt2.pad_id is None and gpt2.unk_id is None
    assert gpt2.special_tokens == {"<|endoftext|>": 50256}
    assert gpt2.encoding._mergeable_ranks == tiktoken_gpt2._mergeable_ranks
    assert gpt2.encoding._pat_str == tiktoken_gpt2._pat_str


def test_gpt2_matches_tiktoken_on_corpus(gpt2, tiktoken_gpt2):
    for text in CORPUS:
        expected = tiktoken_gpt2.encode(text, allowed_special="all")
        assert gpt2.encode(text, allowed_special="all") == expected, text
        assert gpt2.decode(expected) == tiktoken_gpt2.decode(expected)
        # by default user text is text: "<|endoftext|>" in it is not the control token
        assert gpt2.encode(text) == tiktoken_gpt2.encode(text, disallowed_special=()), text
    assert gpt2.encode_batch(CORPUS, allowed_special="all") == tiktoken_gpt2.encode_batch(
        CORPUS, allowed_special="all"
    )


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_gpt2_unicode_round_trip_and_parity(gpt2, tiktoken_gpt2, text):
    ids = gpt2.encode(text)
    assert gpt2.decode(ids) == text
    assert ids == tiktoken_gpt2.encode(text, allowed_special="all")


# -- gpt1-bpe ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt1_dir(tmp_path_factory) -> Path:
    """The reference files under their Hub names (vocab.json, merges.txt)."""
    directory = tmp_path_factory.mktemp("openai-gpt")
    (directory / "vocab.json").write_bytes(GPT1_VOCAB.read_bytes())
    (directory / "merges.txt").write_bytes(GPT1_MERGES.read_bytes())
    return directory


@pytest.fixture(scope="module")
def gpt1(gpt1_dir):
    return zoo.tokenizer("gpt1", directory=gpt1_dir)


@pytest.fixture(scope="module")
def hf_gpt1():
    transformers = pytest.importorskip("transformers")
    return transformers.OpenAIGPTTokenizer(str(GPT1_VOCAB), str(GPT1_MERGES))


def test_gpt1_known_tokens(gpt1):
    ids = gpt1.encode("Hello world! Every effort moves you")
    assert [gpt1.id_to_token(i) for i in ids] == [
        "hello</w>",
        "world</w>",
        "!</w>",
        "every</w>",
        "effort</w>",
        "moves</w>",
        "you</w>",
    ]
    assert gpt1.vocab_size == 40478
    assert gpt1.unk_id == 0 and gpt1.eos_id is None and gpt1.pad_id is None


def test_gpt1_matches_transformers_on_corpus(gpt1, hf_gpt1):
    assert gpt1.vocab_size == len(hf_gpt1)
    for text in CORPUS:
        expected = hf_gpt1.encode(text)
        assert gpt1.encode(text, allowed_special="all") == expected, text
        assert gpt1.decode(expected) == hf_gpt1.decode(expected), text
    assert gpt1.encode_batch(CORPUS, allowed_special="all") == [hf_gpt1.encode(t) for t in CORPUS]


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_gpt1_matches_transformers_on_any_text(gpt1, hf_gpt1, text):
    assert gpt1.encode(text) == hf_gpt1.encode(text)


def test_gpt1_from_original_file_names_and_via_hub_cache(gpt1, monkeypatch):
    """The Hub path: zoo's own download is asked for vocab.json and merges.txt of the pinned
    repo at the commit the Hub answered (stubbed here to the reference files: tests never use
    the network)."""
    from zoo_plugins.gpt1 import tokenizer as gpt1_tokenizer

    direct = gpt1_tokenizer.from_files(GPT1_VOCAB, GPT1_MERGES)
    asked = []
    commit = "a" * 40

    def fake_download(repo_id, filename, commit, *, cache_dir):
        asked.append((repo_id, filename, commit))
        return {"vocab.json": GPT1_VOCAB, "merges.txt": GPT1_MERGES}[filename]

    import zoo.hub.tokenizer_files
    import zoo.hub.transfer

    monkeypatch.setattr(zoo.hub.transfer, "download", fake_download)
    monkeypatch.setattr(zoo.hub.tokenizer_files, "_hub_commit", lambda *args: (commit, None))
    monkeypatch.setattr(zoo.hub.tokenizer_files, "_record_commit", lambda *args: None)
    from_hub = zoo.tokenizer("openai-gpt")
    assert asked == [
        ("openai-community/openai-gpt", "vocab.json", commit),
        ("openai-community/openai-gpt", "merges.txt", commit),
    ]
    text = CORPUS[1] + CORPUS[8]
    assert direct.encode(text) == from_hub.encode(text) == gpt1.encode(text)


def test_gpt1_offline_without_cache_says_how_to_get_the_files(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(zoo.tokenizers.TokenizerUnavailableError) as info:
        zoo.tokenizer("gpt1", cache_dir=tmp_path)
    message = str(info.value)
    assert "HF_HUB_OFFLINE" in message
    assert "HF_ENDPOINT" in message
    assert "directory=" in message
    assert "openai-community/openai-gpt" in message


def test_gpt1_rejects_wrong_files(tmp_path):
    from zoo_plugins.gpt1 import tokenizer as gpt1_tokenizer

    vocab = json.loads(GPT1_VOCAB.read_text())
    vocab.pop("hello</w>")
    small = tmp_path / "vocab.json"
    small.write_text(json.dumps(vocab))
    with pytest.raises(zoo.tokenizers.VocabularyFileError, match="40477 tokens, expected 40478"):
        gpt1_tokenizer.from_files(small, GPT1_MERGES)
    merges = tmp_path / "merges.txt"
    merges.write_text(GPT1_MERGES.read_text().replace("t h\n", "t h x\n", 1))
    with pytest.raises(zoo.tokenizers.VocabularyFileError, match="line 2 is not a merge"):
        gpt1_tokenizer.from_files(GPT1_VOCAB, merges)
    with pytest.raises(zoo.tokenizers.VocabularyFileError, match="cannot read"):
        gpt1_tokenizer.load(directory=tmp_path / "missing")


# -- bert-wordpiece-uncased ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert():
    return zoo.tokenizer("wiki-gpt-wordpiece")


@pytest.fixture(scope="module")
def hf_bert():
    transformers = pytest.importorskip("transformers")
    from zoo_plugins.wiki_gpt.tokenizer import _vocab_path

    return transformers.BertTokenizerFast(str(_vocab_path()))


def test_bert_roles_map_the_special_tokens(bert, hf_bert):
    assert bert.vocab_size == len(hf_bert) == 30522
    # the go / separator / padding roles are BERT's [CLS] / [SEP] / [PAD]
    assert bert.bos_id == bert.cls_id == hf_bert.cls_token_id == 101
    assert bert.eos_id == bert.sep_id == hf_bert.sep_token_id == 102
    assert bert.pad_id == hf_bert.pad_token_id == 0
    assert bert.unk_id == hf_bert.unk_token_id == 100
    assert bert.special_id("[MASK]") == hf_bert.mask_token_id == 103


@pytest.fixture(scope="module")
def hf_bert_split():
    transformers = pytest.importorskip("transformers")
    from zoo_plugins.wiki_gpt.tokenizer import _vocab_path

    return transformers.BertTokenizerFast(str(_vocab_path()), split_special_tokens=True)


def test_bert_matches_transformers_on_corpus(bert, hf_bert, hf_bert_split):
    for text in CORPUS:
        assert bert.encode(text, add_special_tokens=True, allowed_special="all") == (
            hf_bert.encode(text)
        ), text
        expected = hf_bert.encode(text, add_special_tokens=False)
        assert bert.encode(text, allowed_special="all") == expected, text
        # by default "[SEP]" in user text is text, as with split_special_tokens=True
        as_text = hf_bert_split.encode(text, add_special_tokens=False)
        assert bert.encode(text) == as_text, text
        assert bert.decode(expected) == hf_bert.decode(expected), text
        with_specials = hf_bert.encode(text)
        assert bert.decode(with_specials, skip_special_tokens=True) == hf_bert.decode(
            with_specials, skip_special_tokens=True
        )


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_bert_matches_transformers_on_any_text(bert, hf_bert, hf_bert_split, text):
    assert bert.encode(text, add_special_tokens=True, allowed_special="all") == hf_bert.encode(text)
    assert bert.encode(text, add_special_tokens=True) == hf_bert_split.encode(text)


def test_bert_batch_matches_transformers_padding(bert, hf_bert):
    texts = ["Hello world!", "A much longer sentence, with several more word pieces.", ""]
    ours = bert.encode_padded(texts, add_special_tokens=True)
    theirs = hf_bert(texts, padding=True, return_tensors="pt")
    assert ours["input_ids"].tolist() == theirs["input_ids"].tolist()
    assert ours["attention_mask"].tolist() == theirs["attention_mask"].tolist()


# -- shipped files are verified ------------------------------------------------------------------
def test_corrupted_shipped_files_are_refused(tmp_path):
    from zoo_plugins.gpt2 import tokenizer as gpt2_tokenizer
    from zoo_plugins.wiki_gpt import tokenizer as bert_tokenizer

    from zoo.tokenizers import TiktokenTokenizer, VocabularyFileError

    ranks = gpt2_tokenizer._ranks_path().read_bytes()
    corrupted = tmp_path / "gpt2.tiktoken"
    corrupted.write_bytes(ranks.replace(b" 995\n", b" 996\n", 1))
    with pytest.raises(VocabularyFileError, match=r"corrupted.*sha256.*306cd27f"):
        TiktokenTokenizer.from_ranks_file(
            corrupted,
            pattern=gpt2_tokenizer.PATTERN,
            special_tokens={},
            sha256=gpt2_tokenizer.RANKS_SHA256,
            name="gpt2-bpe",
        )
    truncated = tmp_path / "short.tiktoken"
    truncated.write_bytes(b"".join(ranks.splitlines(keepends=True)[:1000]))
    with pytest.raises(VocabularyFileError, match="holds 1000 tokens, expected 50256"):
        TiktokenTokenizer.from_ranks_file(
            truncated,
            pattern=gpt2_tokenizer.PATTERN,
            special_tokens={},
            expected_size=50256,
            name="x",
        )
    garbage = tmp_path / "garbage.tiktoken"
    garbage.write_bytes(b"not base64!! 0\n")
    with pytest.raises(VocabularyFileError, match="line 1 is not 'base64-token rank'"):
        TiktokenTokenizer.from_ranks_file(garbage, pattern=".", special_tokens={}, name="x")

    vocab = bert_tokenizer._vocab_path().read_text(encoding="utf-8")
    other = tmp_path / "vocab.txt"
    other.write_text(vocab.replace("[unused0]", "[unused-zero]"), encoding="utf-8")
    with pytest.raises(VocabularyFileError, match="sha256"):
        bert_tokenizer.from_vocab_file(other)
    short = tmp_path / "short.txt"
    short.write_text("".join(vocab.splitlines(keepends=True)[:-1]), encoding="utf-8")
    with pytest.raises(VocabularyFileError, match="30521 tokens, expected 30522"):
        bert_tokenizer.from_vocab_file(short, sha256=None)
