"""A checkpoint's tokenizer is its own: exported with the weights in Hugging Face's format
(``transformers.AutoTokenizer`` loads it as the same tokenizer), read back from a Hugging
Face GPT-2 folder only when its files are GPT-2's vocabulary, never borrowed."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import tokenizers
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from zoo.checkpoint.hf_tokenizer import TokenizerExportError, hf_tokenizer_files
from zoo.tokenizers.hf_backend import HFTokenizer

TEXTS = [
    "Hello world",
    "Every effort moves you",
    "  several   spaces\n\n\ttabs and\r\nnewlines  ",
    "I'm sure they'll've DON'T 'S: 你好, ünïcödé, 🙂 👩‍👩‍👧, 1234567 + 3.14159 = x;",
    "def f(x):\n    return x ** 2  # comment\n",
]


@pytest.fixture(scope="module")
def gpt2_files() -> dict[str, bytes]:
    """GPT-2's tokenizer as the Hugging Face files zoo.export writes (built once)."""
    return hf_tokenizer_files(zoo.tokenizer("gpt2-124m"), model_max_length=64)


def _tiny_gpt2(folder: Path, vocab_size: int = 50257) -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab_size, n_embd=32, n_layer=1, n_head=4, n_positions=64
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)


def test_convert_to_hf_gpt2_writes_a_tokenizer_transformers_loads(tmp_path, capsys):
    """``zoo convert SRC DST --to hf-gpt2`` of a checkpoint with GPT-2's tokenizer: the
    export loads in transformers as model and tokenizer, and the tokenizer is zoo's."""
    from zoo.cli import main

    _tiny_gpt2(tmp_path / "hf")
    tok = zoo.tokenizer("gpt2-124m")
    zoo.save(zoo.load(tmp_path / "hf"), tmp_path / "zoo", tokenizer=tok)
    assert main(["convert", str(tmp_path / "zoo"), str(tmp_path / "out"), "--to", "hf-gpt2"]) == 0
    assert "with its tokenizer" in capsys.readouterr().out
    out = tmp_path / "out"

    auto = transformers.AutoTokenizer.from_pretrained(out)
    assert auto("Hello world")["input_ids"] == [15496, 995]
    assert auto.eos_token == "<|endoftext|>" and auto.eos_token_id == 50256
    assert auto.model_max_length == 64
    for text in TEXTS:
        ids = tok.encode(text)
        assert auto.encode(text) == ids, text
        assert auto.decode(ids) == text
    assert auto.encode("a<|endoftext|>") == tok.encode("a<|endoftext|>", allowed_special="all")
    # GPT-2's two classic files as well (what the slow tokenizer and other tools read)
    slow = transformers.GPT2Tokenizer(str(out / "vocab.json"), str(out / "merges.txt"))
    assert [slow.encode(t) for t in TEXTS] == [tok.encode(t) for t in TEXTS]
    transformers.GPT2LMHeadModel.from_pretrained(out)  # the model as well
    # and zoo reads the export back with GPT-2's tokenizer (its files are checked, not guessed)
    back = zoo.load(out)
    assert back.tokenizer is not None and back.tokenizer.name == "gpt2-bpe"
    # a checkpoint without a tokenizer converts, saying the export has none
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "bare"), "--to", "hf-gpt2"]) == 0
    assert "without a tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "bare" / "tokenizer.json").exists()


def test_hf_gpt2_folder_with_other_vocabulary_files_gets_no_tokenizer(tmp_path, gpt2_files):
    """A GPT-2 folder whose vocab.json / merges.txt are not GPT-2's (here two ids swapped, or
    merges out of order) gets no tokenizer, with the reason; GPT-2's own files give GPT-2's."""
    _tiny_gpt2(tmp_path)
    files = gpt2_files
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes(files[name])
    assert zoo.load(tmp_path).tokenizer.encode("Hello world") == [15496, 995]

    vocab = json.loads(files["vocab.json"])
    vocab["Hello"], vocab["Ġworld"] = vocab["Ġworld"], vocab["Hello"]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    model = zoo.load(tmp_path)
    assert model.tokenizer is None and "not GPT-2's vocabulary" in model.tokenizer_error

    (tmp_path / "vocab.json").write_bytes(files["vocab.json"])
    lines = files["merges.txt"].decode().splitlines()
    lines[1], lines[-1] = lines[-1], lines[1]
    (tmp_path / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = zoo.load(tmp_path)
    assert model.tokenizer is None and "not a merge of GPT-2's BPE" in model.tokenizer_error


def test_export_gpt1_tokenizer(tmp_path):
    """A tokenizers-library tokenizer (GPT-1's BPE from the vendored files) exports as the
    same tokenizer."""
    from zoo_plugins.gpt1.tokenizer import from_files

    data = Path(__file__).parent / "data" / "gpt1"
    tok = from_files(data / "encoder_bpe_40000.json", data / "vocab_40000.bpe")
    torch.manual_seed(0)
    config = transformers.OpenAIGPTConfig(
        vocab_size=40478, n_embd=32, n_layer=1, n_head=4, n_positions=32
    )
    transformers.OpenAIGPTLMHeadModel(config).save_pretrained(tmp_path / "hf")
    model = zoo.load(tmp_path / "hf")
    model.tokenizer = tok
    zoo.export(model, tmp_path / "out")
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    for text in TEXTS:
        assert auto.encode(text) == tok.encode(text, add_special_tokens=True), text


def test_export_byte_tokenizer(tmp_path):
    """The shipped shakespeare-byte model (byte tokenizer) exports with a tokenizer
    transformers reads as the same bytes."""
    model = zoo.load("shakespeare-byte")
    zoo.export(model, tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert auto.encode(text) == model.tokenizer.encode(text), text
        assert auto.decode(auto.encode(text)) == text


def test_sequence_tokens_are_exported_as_zoo_adds_them(tmp_path):
    """zoo's add_special_tokens=True (Llama's <s> first, BERT-like wrapping) is what the
    exported tokenizer adds by default, as transformers' tokenizers do."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "ab": 5}
    library = tokenizers.Tokenizer(
        tokenizers.models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>")
    )
    library.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    for wrap in (("bos", None), ("bos", "eos"), (None, None)):
        tok = HFTokenizer(
            library, name="t", roles={"bos": "<s>", "eos": "</s>", "unk": "<unk>"}, wrap=wrap
        )
        files = hf_tokenizer_files(tok, model_max_length=None)
        exported = tokenizers.Tokenizer.from_str(files["tokenizer.json"].decode())
        assert exported.encode("ab ba").ids == tok.encode("ab ba", add_special_tokens=True)
        config = json.loads(files["tokenizer_config.json"])
        assert config["bos_token"] == "<s>" and config["unk_token"] == "<unk>"
        folder = tmp_path / "-".join(map(str, wrap))
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        auto = transformers.AutoTokenizer.from_pretrained(folder)
        assert auto.encode("ab ba") == tok.encode("ab ba", add_special_tokens=True)
        assert auto.encode("ab", add_special_tokens=False) == tok.encode("ab")


def test_a_tokenizer_that_cannot_be_exported_is_a_warning_naming_why(tmp_path):
    _tiny_gpt2(tmp_path / "hf", vocab_size=64)
    model = zoo.load(tmp_path / "hf")
    model.tokenizer = object()
    with pytest.raises(TokenizerExportError, match="object"):
        hf_tokenizer_files(model.tokenizer, model_max_length=None)
    with pytest.warns(UserWarning, match="no tokenizer files written.*object"):
        zoo.export(model, tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    model.tokenizer = None  # none at all: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zoo.export(model, tmp_path / "out2")


def test_hf_repo_keeps_the_tokenizer_it_ships(local_hub, tmp_path):
    """``zoo.load("hf:org/name")`` of a GPT-2 repo shipping GPT-2's vocab.json + merges.txt
    has GPT-2's tokenizer; the same weights in a repo without them have none (not borrowed
    because the vocabulary has 50,257 ids)."""
    _tiny_gpt2(tmp_path / "hf")
    model = zoo.load(tmp_path / "hf")
    files = {p.name: p for p in (tmp_path / "hf").iterdir() if p.is_file()}
    local_hub.add_files("org/bare", files)
    model.tokenizer = zoo.tokenizer("gpt2-124m")
    zoo.export(model, tmp_path / "out")
    exported = tmp_path / "out"
    shipped = {n: exported / n for n in ("config.json", "model.safetensors", "vocab.json")}
    local_hub.add_files("org/with-tokenizer", {**shipped, "merges.txt": exported / "merges.txt"})

    loaded = zoo.load("hf:org/with-tokenizer")
    assert loaded.tokenizer is not None and loaded.tokenizer.encode("Hello world") == [15496, 995]
    bare = zoo.load("hf:org/bare")
    assert bare.tokenizer is None and "never guesses" in bare.tokenizer_error


def test_gpt2_folder_saved_by_transformers5_keeps_its_tokenizer(tmp_path, gpt2_files):
    """transformers 5 saves GPT-2's tokenizer as tokenizer.json alone: checked to be GPT-2's,
    it gives gpt2-bpe (tiktoken); the same file with another pre-tokenizer, vocabulary or
    <|endoftext|> is not GPT-2's, and zoo.load uses it as written (as transformers does)."""
    _tiny_gpt2(tmp_path / "model")
    src = tmp_path / "src"
    src.mkdir()
    for name, data in gpt2_files.items():
        (src / name).write_bytes(data)
    transformers.GPT2Tokenizer(str(src / "vocab.json"), str(src / "merges.txt")).save_pretrained(
        tmp_path / "model"
    )
    folder = tmp_path / "model"
    assert not (folder / "vocab.json").exists() and (folder / "tokenizer.json").exists()
    tok = zoo.load(folder).tokenizer
    assert tok.name == "gpt2-bpe" and tok.encode("Hello world") == [15496, 995]

    original = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    exported = json.loads(gpt2_files["tokenizer.json"])["pre_tokenizer"]  # tiktoken's split
    regex_twice = json.loads(json.dumps(exported))
    regex_twice["pretokenizers"][1]["use_regex"] = True  # GPT-2's regex again on each piece

    def endoftext(**flags: object):  # type: ignore[no-untyped-def]
        return lambda d: d["added_tokens"][0].update(flags)

    changes = [
        ("pre_tokenizer", lambda d: d["pre_tokenizer"].update(add_prefix_space=True)),
        ("normalizer", lambda d: d.update(normalizer={"type": "Lowercase"})),
        ("added_tokens", lambda d: d["added_tokens"].append({"id": 50257, "content": "<pad>"})),
        ("not GPT-2's vocabulary", lambda d: d["model"]["vocab"].pop("Hello")),
        ("not a merge", lambda d: d["model"].update(merges=d["model"]["merges"][::-1])),
        ("added_tokens", endoftext(lstrip=True)),
    ]
    from zoo_plugins.gpt2.tokenizer import _check_pipeline
    from zoo_plugins.gpt2.tokenizer import load as gpt2_tokenizer

    from zoo.tokenizers import VocabularyFileError

    pipeline = {k: v for k, v in original.items() if k != "model"}  # (cheap: no vocabulary)
    for reason, change in [
        ("pre_tokenizer", lambda d: d.update(pre_tokenizer=regex_twice)),
        ("added_tokens", endoftext(special=False)),
        ("added_tokens", endoftext(rstrip=True)),
    ]:
        data = json.loads(json.dumps(pipeline))
        change(data)
        with pytest.raises(VocabularyFileError, match=reason):
            _check_pipeline({**data, "model": original["model"]}, "tokenizer.json")
    _check_pipeline({**pipeline, "pre_tokenizer": exported, "model": original["model"]}, "-")
    for reason, change in changes:
        data = json.loads(json.dumps(original))
        change(data)
        (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
        with pytest.raises(VocabularyFileError, match=reason):
            gpt2_tokenizer(directory=folder)
    # the last: gpt2-bpe refuses it (tiktoken keeps the space in "a <|endoftext|>", the file's
    # lstrip takes it), so zoo.load uses the file as written
    model = zoo.load(folder)
    assert isinstance(model.tokenizer, HFTokenizer) and model.tokenizer_error is None
    assert model.tokenizer.encode("a <|endoftext|>", allowed_special="all") == [64, 50256]
    assert model.tokenizer.encode("a <|endoftext|>") == [64, 1279, 91, 437, 1659, 5239, 91, 29]


def test_checkpoint_files_may_list_alternative_sets():
    from zoo.plugin.specs import TokenizerSpec

    def spec(files):  # type: ignore[no-untyped-def]
        return TokenizerSpec("t", "m:f", reads_checkpoint=True, checkpoint_files=files)

    assert spec(("a.json", "b.txt")).checkpoint_file_sets == (("a.json", "b.txt"),)
    assert spec((("a.json", "b.txt"), ("c.json",))).checkpoint_file_sets == (
        ("a.json", "b.txt"),
        ("c.json",),
    )
    assert spec(()).checkpoint_file_sets == ()
    for bad in ((("a.json",), "b.txt"), (("../a.json",),), ((),), "a.json"):
        with pytest.raises(ValueError, match="checkpoint_files"):
            spec(bad)


# -- a tokenizer.json the tokenizers library reads is used as written --------------------------
#: Text for the ids of a folder's tokenizer against the references: unicode, spaces, and the
#: special token alone, inside words and repeated.
SPECIAL_TEXTS = [
    *TEXTS,
    "",
    " ",
    "1234567 digits and 'LL 'Ve contractions",
    "<|endoftext|>",
    "a<|endoftext|>b <|endoftext|><|endoftext|> c",
    "\u00a0\u2028x\u3000y\x00\ufeff",
]


@pytest.fixture(scope="module")
def split_gpt2(tmp_path_factory, gpt2_files) -> tuple[Path, HFTokenizer, object, object]:
    """A GPT-2 folder as transformers 5 saves one whose tokenizer.json came from its
    TikTokenConverter: GPT-2's ranks, a Sequence[Split, ByteLevel] pre-tokenizer with the
    converter's own split pattern (not GPT-2's). With zoo's tokenizer for it, transformers'
    and the tokenizers library's."""
    import inspect

    from transformers.convert_slow_tokenizer import TikTokenConverter

    folder = tmp_path_factory.mktemp("split-gpt2")
    _tiny_gpt2(folder)
    data = json.loads(gpt2_files["tokenizer.json"])  # what the converter builds from the ranks
    pattern = inspect.signature(TikTokenConverter).parameters["pattern"].default
    data["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
    library = tokenizers.Tokenizer.from_str(json.dumps(data))
    library.post_processor = tokenizers.processors.ByteLevel(trim_offsets=False)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=library, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    ).save_pretrained(folder)
    assert not (folder / "vocab.json").exists()
    model = zoo.load(folder)
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    return (
        folder,
        model.tokenizer,
        auto,
        tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")),
    )


def test_gpt2_folder_with_another_split_uses_its_tokenizer_json(split_gpt2, capsys):
    """The folder once loaded with "not GPT-2's tokenizer" and none. Its own
    tokenizer.json is used as written: the ids of transformers and of the library (here not
    GPT-2's: digits go in threes), its roles and end id; `zoo generate` needs no --tokenizer."""
    folder, tok, auto, library = split_gpt2
    assert isinstance(tok, HFTokenizer) and tok.eos_id == 50256 and tok.end_ids == (50256,)
    for text in SPECIAL_TEXTS:
        ids = tok.encode(text, allowed_special="all")
        assert ids == auto.encode(text) == library.encode(text).ids, text
        assert tok.encode(text, allowed_special="all", add_special_tokens=True) == ids
        assert tok.decode(ids) == auto.decode(ids) == text
        # user text is text: the special token's characters, as the library's split_special_tokens
        split = auto(text, split_special_tokens=True)["input_ids"]
        assert tok.encode(text) == split, text
    digits = tok.encode("1234567")
    assert digits == auto.encode("1234567") != zoo.tokenizer("gpt2-124m").encode("1234567")

    from zoo.cli import main

    args = ["generate", str(folder), "Hello", "--max-new-tokens", "2", "--temperature", "0"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("Hello")


@settings(max_examples=60, deadline=None)
@given(text=st.lists(st.one_of(st.text(max_size=40), st.just("<|endoftext|>"))).map("".join))
def test_a_folder_tokenizer_json_matches_transformers_on_any_text(split_gpt2, text):
    _, tok, auto, library = split_gpt2
    ids = tok.encode(text, allowed_special="all")
    assert ids == auto.encode(text) == library.encode(text).ids
    assert tok.decode(ids) == text


def _word_level_folder(folder: Path, **options: object) -> tokenizers.Tokenizer:
    """A small tokenizer.json (word level, whitespace split) alone in ``folder``."""
    words = ["one", "two", "three", "four", "five", "six"]
    vocab = {"[UNK]": 0, **{word: i + 1 for i, word in enumerate(words)}}
    library = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    library.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    if options:
        library.enable_truncation(max_length=4)
        library.enable_padding(length=8, pad_id=0, pad_token="[UNK]")
    library.save(str(folder / "tokenizer.json"))
    return library


def test_a_tokenizer_json_alone_beside_any_family_is_its_tokenizer(tmp_path):
    """A tokenizer.json without tokenizer_config.json (what a Hub pull fetches) beside a model
    no registered tokenizer fits is used as written, not dropped."""
    _tiny_gpt2(tmp_path, vocab_size=64)
    (tmp_path / "generation_config.json").unlink()  # (its eos id, 50256, is GPT-2's)
    _word_level_folder(tmp_path)
    model = zoo.load(tmp_path)
    assert model.tokenizer is not None, model.tokenizer_error
    assert model.tokenizer.encode("three one six") == [3, 1, 6]


def test_truncation_and_padding_in_a_tokenizer_json_do_not_cut_or_pad_ids(tmp_path):
    """A tokenizer.json may enable truncation and padding; transformers turns both off for an
    encode that asks for neither, and so does zoo: every id of the text, none added (the
    library cut each encoded piece to 4 ids and padded it to 8)."""
    from zoo.tokenizers.pretrained import from_pretrained

    library = _word_level_folder(tmp_path, truncation=True)
    (tmp_path / "tokenizer_config.json").write_text('{"unk_token": "[UNK]"}', encoding="utf-8")
    tok = from_pretrained(tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "one two three four five six"
    assert tok.encode(text) == auto.encode(text) == [1, 2, 3, 4, 5, 6]
    assert tok.encode("two") == auto.encode("two") == [2]
    assert library.truncation is not None  # the caller's library tokenizer is left as it was


def test_a_folder_file_neither_gpt2_nor_readable_is_refused_with_both_reasons(tmp_path):
    _tiny_gpt2(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Nope"}}', encoding="utf-8")
    model = zoo.load(tmp_path)
    assert model.tokenizer is None
    assert "not GPT-2's tokenizer" in model.tokenizer_error
    assert "right one; nor can zoo use it as written" in model.tokenizer_error
    assert "is not a valid tokenizers file" in model.tokenizer_error
