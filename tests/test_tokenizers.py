"""The tokenizer protocol: registry wiring, batches, bad input, the trainable subword tokenizer,
and saving / loading next to weights. Parity with the reference libraries is in
``test_tokenizers_reference.py``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import zoo
from zoo.tokenizers import (
    SubwordBPE,
    Tokenizer,
    TokenizerError,
    TokenizerInputError,
    TokenizerUnavailableError,
    VocabularyFileError,
    load_directory,
    load_tokenizer,
    save_tokenizer,
)

#: Named model -> (tokenizer name, plugin that declares it, vocab size); gpt1 needs its Hub
#: files and transformer-encdec a trained vocabulary, so only their declarations are checked.
BUILTIN = {
    "gpt1": ("gpt1-bpe", "plugin gpt1", 40478),
    "gpt2-124m": ("gpt2-bpe", "plugin gpt2", 50257),
    "wiki-gpt-wordpiece": ("bert-wordpiece-uncased", "plugin wiki_gpt", 30522),
    "transformer-encdec": ("subword-bpe", "plugin transformer_encdec", 37000),
    "transformer-encdec-tiny": ("subword-bpe", "plugin transformer_encdec", 30000),
}
SHIPPED = ["gpt2-124m", "wiki-gpt-wordpiece"]

TRAIN_TEXTS = [
    "the encoder reads the source sentence",
    "the decoder writes the target sentence",
    "der Kodierer liest den Quellsatz",
    "der Dekodierer schreibt den Zielsatz",
    "attention is all you need",
    "Aufmerksamkeit ist alles, was man braucht",
] * 20


@pytest.fixture(scope="module")
def subword() -> SubwordBPE:
    return SubwordBPE.train(TRAIN_TEXTS, vocab_size=320)


@pytest.fixture(scope="module", params=SHIPPED)
def shipped(request) -> Tokenizer:
    return zoo.tokenizer(request.param)


# -- registry ------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", sorted(BUILTIN))
def test_each_plugin_declares_its_models_tokenizer(model):
    name, plugin, vocab_size = BUILTIN[model]
    registry = zoo.get_registry()
    assert registry.model(model).tokenizer == name
    assert registry.source("tokenizer", name) == plugin
    assert registry.source("architecture", registry.model(model).architecture) == plugin
    assert zoo.resolve_config(model)[2].vocab_size == vocab_size  # the architecture default
    description = zoo.info(model).tokenizer_description
    assert description == registry.tokenizer(name).description and description


@pytest.mark.parametrize("model", SHIPPED)
def test_shipped_tokenizers_fit_their_model(model):
    tokenizer = zoo.tokenizer(model)
    assert isinstance(tokenizer, Tokenizer)
    assert tokenizer.name == BUILTIN[model][0]
    assert tokenizer.vocab_size == zoo.resolve_config(model)[2].vocab_size
    assert tokenizer.by_name
    assert tokenizer.name in tokenizer.describe() and tokenizer.backend in tokenizer.describe()


def test_tokenizer_resolves_aliases_and_tokenizer_names():
    assert zoo.tokenizer("gpt2").encode("Hello world") == [15496, 995]
    assert zoo.tokenizer("gpt2-bpe").encode("Hello world") == [15496, 995]


def test_unknown_name_lists_models_and_tokenizers():
    with pytest.raises(
        zoo.UnknownModelError, match=r"gpt2-124m.*Registered tokenizers: .*gpt2-bpe"
    ):
        zoo.tokenizer("gpt3")


def test_model_without_tokenizer_says_so():
    assert zoo.get_registry().model("toy-gpt-tiny").tokenizer is None
    with pytest.raises(zoo.ZooError, match="declares no tokenizer"):
        zoo.tokenizer("toy-gpt-tiny")


def test_import_zoo_stays_light():
    code = (
        "import sys, zoo, zoo.tokenizers; zoo.list_models(); "
        "heavy = ('torch', 'tiktoken', 'tokenizers', 'transformers'); "
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- encode / decode / batches -------------------------------------------------------------------
def test_encode_padded_pads_and_masks(shipped):
    texts = ["Hello world", "Every effort moves you to the end of this line", ""]
    batch = shipped.encode_padded(texts)
    ids = shipped.encode_batch(texts)
    longest = max(map(len, ids))
    assert batch["input_ids"].dtype == batch["attention_mask"].dtype == torch.long
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (3, longest)
    pad = shipped.pad_id if shipped.pad_id is not None else shipped.eos_id
    for row, seq in enumerate(ids):
        assert batch["input_ids"][row, : len(seq)].tolist() == seq
        assert batch["input_ids"][row, len(seq) :].eq(pad).all()
        assert batch["attention_mask"][row].tolist() == [1] * len(seq) + [0] * (longest - len(seq))
    left = shipped.encode_padded(texts, padding_side="left")
    for row, seq in enumerate(ids):
        assert left["input_ids"][row, longest - len(seq) :].tolist() == seq
        assert left["attention_mask"][row].sum().item() == len(seq)


def test_batch_encode_is_the_deprecated_name_of_encode_padded(shipped):
    texts = ["Hello world", "Hi"]
    with pytest.warns(DeprecationWarning, match="encode_padded"):
        old = shipped.batch_encode(texts, padding_side="left")
    new = shipped.encode_padded(texts, padding_side="left")
    assert all(torch.equal(old[k], new[k]) for k in ("input_ids", "attention_mask"))


def test_encode_padded_max_length_and_truncation():
    bert = zoo.tokenizer("wiki-gpt-wordpiece")
    texts = ["one two three four five six seven", "one"]
    batch = bert.encode_padded(
        texts, max_length=5, truncation=True, padding="max_length", add_special_tokens=True
    )
    assert batch["input_ids"].shape == (2, 5)
    full = bert.encode(texts[0], add_special_tokens=True)
    assert batch["input_ids"][0].tolist() == [*full[:4], bert.sep_id]  # [SEP] kept
    assert batch["input_ids"][1].tolist() == [bert.cls_id, *bert.encode("one"), bert.sep_id, 0, 0]
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0]]
    with pytest.raises(TokenizerError, match="more than max_length=5; pass truncation=True"):
        bert.encode_padded(texts, max_length=5)
    with pytest.raises(TokenizerError, match="needs max_length"):
        bert.encode_padded(texts, padding="max_length")
    with pytest.raises(TokenizerError, match="padding must be"):
        bert.encode_padded(texts, padding="shortest")  # type: ignore[arg-type]
    empty = bert.encode_padded([])
    assert empty["input_ids"].shape == (0, 0)


def test_decode_accepts_tensors(shipped):
    ids = shipped.encode("Every effort moves you")
    assert shipped.decode(torch.tensor(ids)) == shipped.decode(ids)
    batch = shipped.encode_padded(["Every effort moves you"])["input_ids"]
    assert shipped.decode_batch(batch) == [shipped.decode(ids)]


@pytest.mark.parametrize("bad", [None, 42, b"bytes", ["a list"], 3.5])
def test_encode_refuses_non_text(shipped, bad):
    with pytest.raises(TokenizerInputError, match="takes text as str") as info:
        shipped.encode(bad)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    if isinstance(bad, bytes):
        assert "decode bytes first" in str(info.value)


def test_batch_refuses_non_text(shipped):
    with pytest.raises(TokenizerInputError, match="item 1 of the batch"):
        shipped.encode_batch(["fine", 7])
    with pytest.raises(TokenizerInputError, match="wrap a single text in a list"):
        shipped.encode_batch("just one string")


def test_decode_refuses_ids_outside_the_vocabulary(shipped):
    top = shipped.vocab_size - 1
    shipped.decode([0, top])
    for bad in (shipped.vocab_size, -1, 10**9):
        with pytest.raises(TokenizerError, match=rf"id {bad} is outside .* 0 \.\. {top}"):
            shipped.decode([0, bad])
    with pytest.raises(TokenizerInputError, match="int ids, got str"):
        shipped.decode(["hello"])
    with pytest.raises(TokenizerInputError, match="use decode_batch"):
        shipped.decode([[1, 2]])
    with pytest.raises(TokenizerInputError, match="sequence of int ids"):
        shipped.decode("hello")


def test_unknown_special_tokens_are_refused(shipped):
    with pytest.raises(TokenizerError, match=r"no special token '<\|im_start\|>'; its special"):
        shipped.special_id("<|im_start|>")
    with pytest.raises(TokenizerError, match="unknown special-token role"):
        SubwordBPE(SubwordBPE.train(TRAIN_TEXTS, 300).tokenizer, roles={"start": "<s>"})
    with pytest.raises(TokenizerError, match="the eos token '<end>' is not in the vocabulary"):
        SubwordBPE(SubwordBPE.train(TRAIN_TEXTS, 300).tokenizer, roles={"eos": "<end>"})


def test_skip_special_tokens():
    gpt2 = zoo.tokenizer("gpt2-124m")
    ids = gpt2.encode("a<|endoftext|>b", allowed_special="all")
    assert ids.count(50256) == 1
    assert gpt2.decode(ids) == "a<|endoftext|>b"
    assert gpt2.decode(ids, skip_special_tokens=True) == "ab"


# -- subword-bpe ---------------------------------------------------------------------------------
def test_untrained_subword_tokenizer_says_what_to_do():
    with pytest.raises(TokenizerUnavailableError, match=r"SubwordBPE\.train.*directory="):
        zoo.tokenizer("transformer-encdec")


def test_subword_training(subword):
    assert subword.vocab_size == 320
    assert [subword.pad_id, subword.unk_id, subword.bos_id, subword.eos_id] == [0, 1, 2, 3]
    assert subword.special_tokens == {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3}
    assert not subword.by_name
    text = "the encoder reads the target sentence"
    assert len(subword.encode(text)) < len(text.encode()) / 2  # learned merges
    assert subword.encode("the decoder", add_special_tokens=True) == [
        2,
        *subword.encode("the decoder"),
        3,
    ]


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=100))
def test_subword_round_trips_any_text(subword, text):
    ids = subword.encode(text)
    assert subword.unk_id not in ids or "<unk>" in text
    assert subword.decode(ids) == text


def test_subword_training_rejects_bad_input():
    with pytest.raises(TokenizerError, match="vocab_size=100 is too small"):
        SubwordBPE.train(TRAIN_TEXTS, vocab_size=100)
    with pytest.raises(TokenizerError, match="vocab_size must be an int"):
        SubwordBPE.train(TRAIN_TEXTS, vocab_size="big")  # type: ignore[arg-type]
    with pytest.raises(TokenizerInputError, match="not one str"):
        SubwordBPE.train("one text", vocab_size=300)
    with pytest.raises(TokenizerError, match="got no texts"):
        SubwordBPE.train([], vocab_size=300)
    with pytest.raises(TokenizerInputError, match="training text 1 is int"):
        SubwordBPE.train(["fine", 1], vocab_size=300)


def test_subword_save_and_load(subword, tmp_path):
    files = subword.save(tmp_path)
    assert sorted(files) == ["tokenizer.json", "zoo_tokenizer.json"]
    for loaded in (
        load_directory(tmp_path),
        zoo.tokenizer("transformer-encdec", directory=tmp_path),
    ):
        assert isinstance(loaded, SubwordBPE)
        assert loaded.vocab_size == subword.vocab_size
        assert loaded.roles == subword.roles
        for text in TRAIN_TEXTS[:6]:
            assert loaded.encode(text, add_special_tokens=True) == subword.encode(
                text, add_special_tokens=True
            )


# -- save_tokenizer / load_tokenizer (used by the weights) ---------------------------------------
def test_shipped_tokenizers_are_saved_by_name(shipped, tmp_path):
    spec = save_tokenizer(shipped, tmp_path)
    assert spec == {"name": shipped.name}
    assert list(tmp_path.iterdir()) == []
    assert json.loads(json.dumps(spec)) == spec
    again = load_tokenizer(spec, tmp_path, by_name=zoo.tokenizer)
    assert again.name == shipped.name
    assert again.encode("Every effort moves you") == shipped.encode("Every effort moves you")
    with pytest.raises(TokenizerError, match="stored by name only: pass by_name="):
        load_tokenizer(spec, tmp_path)  # zoo.tokenizers knows no names: the caller does


def test_trained_tokenizer_travels_with_its_files(subword, tmp_path):
    spec = save_tokenizer(subword, tmp_path / "weights")
    assert spec == {"name": "subword-bpe", "files": ["tokenizer.json", "zoo_tokenizer.json"]}
    assert json.loads(json.dumps(spec)) == spec
    again = load_tokenizer(spec, tmp_path / "weights")
    assert again.encode("attention is all you need") == subword.encode("attention is all you need")


def test_load_tokenizer_reports_missing_corrupted_or_mismatched_files(subword, tmp_path):
    spec = save_tokenizer(subword, tmp_path)
    with pytest.raises(VocabularyFileError, match="lacks the tokenizer file"):
        load_tokenizer(spec, tmp_path / "elsewhere")
    with pytest.raises(TokenizerError, match="holds tokenizer 'subword-bpe' but the spec names"):
        load_tokenizer({**spec, "name": "other-bpe"}, tmp_path)
    with pytest.raises(TokenizerError, match="mapping with a 'name'"):
        load_tokenizer(["subword-bpe"], tmp_path)  # type: ignore[arg-type]
    path = tmp_path / "tokenizer.json"
    path.write_text(path.read_text().replace('"<s>"', '"<S>"'))
    with pytest.raises(
        VocabularyFileError, match=r"tokenizer \(tokenizer.json\).*corrupted.*sha256"
    ):
        load_tokenizer(spec, tmp_path)
    (tmp_path / "zoo_tokenizer.json").write_text('{"format": "something-else"}')
    with pytest.raises(VocabularyFileError, match="not a zoo tokenizer manifest"):
        load_directory(tmp_path)
    with pytest.raises(VocabularyFileError, match=r"zoo_tokenizer\.json is missing"):
        load_directory(tmp_path / "nothing-here")


def test_any_tokenizer_saves_to_a_directory(shipped, tmp_path):
    """save() is self-contained for every tokenizer, shipped ones included."""
    shipped.save(tmp_path)
    loaded = load_directory(tmp_path)
    assert type(loaded) is type(shipped)
    assert not loaded.by_name
    assert (loaded.name, loaded.vocab_size, loaded.roles) == (
        shipped.name,
        shipped.vocab_size,
        shipped.roles,
    )
    text = "Café naïve — 1,234 emoji 😀\nnew line <|endoftext|> [SEP]"
    assert loaded.encode(text, add_special_tokens=True) == shipped.encode(
        text, add_special_tokens=True
    )
    assert loaded.special_tokens == shipped.special_tokens


# -- hostile and large input ------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_tokenizers(tmp_path_factory):
    """Every tokenizers-backed tokenizer that needs no network: BERT WordPiece, GPT-1 BPE on
    the vendored files, and a trained byte-level subword BPE."""
    from pathlib import Path

    gpt1_dir = tmp_path_factory.mktemp("gpt1")
    data = Path(__file__).parent / "data" / "gpt1"
    (gpt1_dir / "vocab.json").write_bytes((data / "encoder_bpe_40000.json").read_bytes())
    (gpt1_dir / "merges.txt").write_bytes((data / "vocab_40000.bpe").read_bytes())
    return [
        zoo.tokenizer("wiki-gpt-wordpiece"),
        zoo.tokenizer("gpt1", directory=gpt1_dir),
        SubwordBPE.train(TRAIN_TEXTS, 300),
    ]


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(list("ab cé,.!\n\t  Zé中😀[SEP]<s>"))
        | st.characters(exclude_categories=("Cs",)),  # valid text (surrogates: refused)
        max_size=300,
    )
)
@example(text="00000\u2e52")  # a mark newer than the library's tables: BERT keeps one word
@example(text="00000\xad0")  # a soft hyphen: punctuation in Unicode 3.2, a format character now
def test_chunked_encoding_equals_whole_encoding(hf_tokenizers, text):
    """Long texts are encoded in pieces (bounded memory): pieces of a few characters must give
    exactly the ids the library gives for the whole text."""
    import zoo.tokenizers.hf_backend as backend

    for tok in hf_tokenizers:
        whole = tok._as_text.encode(text, add_special_tokens=False).ids  # one piece, unchunked
        old = backend.CHUNK_CHARS, backend.CHUNKS_AT_ONCE
        backend.CHUNK_CHARS, backend.CHUNKS_AT_ONCE = 5, 2
        try:
            assert tok.encode(text) == whole, (tok.name, text)
        finally:
            backend.CHUNK_CHARS, backend.CHUNKS_AT_ONCE = old


def test_a_large_text_is_encoded_in_pieces(hf_tokenizers, monkeypatch):
    import zoo.tokenizers.hf_backend as backend

    text = "the quick brown fox jumps over the lazy dog. " * 20_000  # ~900 KB
    whole = hf_tokenizers[0].tokenizer.encode(text, add_special_tokens=False).ids
    sizes: list[int] = []
    real = backend._pieces

    def recording(text, size, *rule):
        for piece in real(text, size, *rule):
            sizes.append(len(piece))
            yield piece

    monkeypatch.setattr(backend, "_pieces", recording)
    assert hf_tokenizers[0].encode(text) == whole
    assert len(sizes) > 10 and max(sizes) < 2 * backend.CHUNK_CHARS


@pytest.mark.parametrize("name", ["gpt2-124m", "wiki-gpt-wordpiece"])
def test_a_lone_surrogate_is_a_clear_error(name):
    tok = zoo.tokenizer(name)
    with pytest.raises(TokenizerInputError, match=r"lone surrogate '\\ud800' at index 1"):
        tok.encode("a\ud800b")
    with pytest.raises(TokenizerInputError, match="item 1 of the batch"):
        tok.encode_batch(["fine", "a\udfffb"])


@pytest.mark.parametrize(
    ("name", "text", "special", "as_id"),
    [
        ("gpt2-124m", "hi<|endoftext|>there", "<|endoftext|>", 50256),
        ("wiki-gpt-wordpiece", "hi [SEP] there", "[SEP]", 102),
    ],
)
def test_special_tokens_in_user_text_are_text_by_default(name, text, special, as_id):
    """ "<|endoftext|>" in user text became id 50256, "[SEP]" 102, with no opt-out."""
    tok = zoo.tokenizer(name)
    assert as_id not in tok.encode(text)
    assert as_id in tok.encode(text, allowed_special="all")
    assert as_id in tok.encode(text, allowed_special={special})
    assert tok.encode_batch([text])[0] == tok.encode(text)
    with pytest.raises(TokenizerError, match="has no special token"):
        tok.encode(text, allowed_special={"<nope>"})


def test_a_panic_in_the_rust_library_is_a_tokenizer_error():
    """A hostile tokenizer.json can make the Rust library panic: PanicException is a
    BaseException, so `zoo generate` printed an 85-line traceback."""
    PanicException = type("PanicException", (BaseException,), {})  # pyo3's, by name

    class Panicking:
        def encode_batch_fast(self, *args, **kwargs):
            raise PanicException("regex automaton exceeded its size limit")

        decode = encode_batch_fast

    tok = SubwordBPE.train(TRAIN_TEXTS, 300)
    tok.tokenizer = Panicking()
    tok._as_text = Panicking()
    with pytest.raises(TokenizerError, match="tokenizers library failed"):
        tok.encode("hello")
    with pytest.raises(TokenizerError, match="tokenizers library failed"):
        tok.decode([1, 2])


# -- byte -----------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=200))
def test_byte_tokenizer_round_trips_any_text(text):
    byte = zoo.tokenizer("byte")
    ids = byte.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert byte.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_byte_tokenizer_round_trips_any_bytes(data):
    """Bytes that are not UTF-8 too: decode() would turn them into U+FFFD, decode_bytes()
    gives them back exactly."""
    byte = zoo.tokenizer("byte")
    ids = byte.encode_bytes(data)
    assert ids == list(data)
    assert byte.decode_bytes(ids) == data
    assert byte.decode_bytes(torch.tensor(ids, dtype=torch.long)) == data


def test_byte_tokenizer_bytes_api_refuses_text_and_keeps_specials():
    byte = zoo.tokenizer("byte")
    with pytest.raises(TokenizerInputError, match="text goes to encode"):
        byte.encode_bytes("text")
    assert byte.decode_bytes([0xFF, 256, 0x80]) == b"\xff<|endoftext|>\x80"
    assert byte.decode_bytes([0xFF, 256, 0x80], skip_special_tokens=True) == b"\xff\x80"
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        byte.decode_bytes([257])


def test_byte_tokenizer_specials():
    byte = zoo.tokenizer("byte")
    assert byte.vocab_size == 257 and byte.eos_id == byte.bos_id == 256
    assert 256 not in byte.encode("a<|endoftext|>b")  # user text is text
    ids = byte.encode("a<|endoftext|>b", allowed_special="all")
    assert ids == [97, 256, 98]
    assert (
        byte.decode(ids) == "a<|endoftext|>b" and byte.decode(ids, skip_special_tokens=True) == "ab"
    )
    assert byte.by_name  # rebuilt from its name: a checkpoint stores no file for it
