"""The encoder-decoders' tokenizers against transformers' own, on text none of them was
trained on, both directions:

- Marian's SentencePiece pair (``source.spm``, ``target.spm``, ``vocab.json``, as
  ``MarianTokenizer.save_pretrained`` writes them; :mod:`zoo.tokenizers.sentencepiece_pair`):
  source ids (with ``</s>``), target ids (``text_target=``) and decoded text equal
  ``MarianTokenizer``'s, with one vocabulary or the target's own;
- T5's ``tokenizer.json`` (a ``T5Tokenizer`` made from a trained SentencePiece model) and
  BART's (a byte-level BPE trained with the ``tokenizers`` library), read as written.

No real OPUS-MT, T5 or BART vocabulary is on this machine: the tests train small ones on
lines of tinyshakespeare and hold other lines out, plus hostile strings (empty, Unicode the
models never saw, very long, special-token strings, language codes). ``zoo.load`` of each
family's folder attaches the tokenizer, and ``zoo.generate`` of text (greedy and beam) gives
transformers' ``generate`` decoded; ``zoo generate FOLDER "text"`` prints the translation.
Files that could crash the library (corrupted models) are read in a child process.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import google.protobuf  # noqa: F401  (transformers 5 reads spiece.model through it)
import pytest
import torch
import transformers
from seq2seq_parity import randomize
from spm_vocab import marian_vocab as _marian_vocab
from spm_vocab import train_spm as _train_spm

import zoo
from zoo.tokenizers import load_directory, load_folder
from zoo.tokenizers.errors import TokenizerUnavailableError, VocabularyFileError
from zoo.tokenizers.sentencepiece_pair import SentencePiecePair

REPO = Path(__file__).resolve().parent.parent
LINES = [
    line
    for line in (REPO / "plugins/shakespeare/data/tinyshakespeare.txt").read_text().splitlines()
    if line.strip()
]
#: Training text: the first lines; held-out text: lines far from them.
HELD_IN_SOURCE, HELD_IN_TARGET = LINES[:1500], LINES[1500:3000]
HELD_OUT = LINES[20000:20120]
HOSTILE = [
    "",
    " ",
    "  spaced   out  ",
    "ünïcödé 日本語 🙂 ￿",
    "tab\tnew\nline\r\n",
    "x" * 20000,
    " ".join(LINES[3000:3400]),
    "\u2581 a \u2581\u2581b",
    "\x00nul",
    "qqqzzzjjj",
    "<unk> </s> <pad> text <s> <mask> <extra_id_0>",
    "</s></s>",
    ">>fr<< Bonjour",
    ">>de<<",
    ">> no code",
    "a >>fr<< inside",
    "Hello , world . It 's n't",
]
TEXTS = HELD_OUT + HOSTILE
SOURCE = "First Citizen: Before we proceed any further, hear me speak."

#: transformers' MarianTokenizer asks for sacremoses, which it never uses to encode.
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


@pytest.fixture(scope="module")
def spm_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A source and a target SentencePiece model, trained on different held-in lines."""
    where = tmp_path_factory.mktemp("spm")
    source = _train_spm(HELD_IN_SOURCE, where / "source", 500)
    target = _train_spm(HELD_IN_TARGET, where / "target", 600)
    return source, target


def _marian_folder(where: Path, spm_models: tuple[Path, Path], *, separate: bool) -> Path:
    source, target = spm_models
    if separate:
        (where / "v.json").write_text(json.dumps(_marian_vocab([source], drop_every=7)))
        (where / "tv.json").write_text(json.dumps(_marian_vocab([target], drop_every=5)))
        options = {"target_vocab_file": str(where / "tv.json"), "separate_vocabs": True}
    else:
        (where / "v.json").write_text(json.dumps(_marian_vocab([source, target])))
        options = {}
    made = transformers.MarianTokenizer(
        str(source), str(target), str(where / "v.json"), source_lang="en", target_lang="de",
        **options,
    )  # fmt: skip
    folder = where / "tokenizer"
    made.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["shared", "separate"])
def marian(request: pytest.FixtureRequest, spm_models, tmp_path_factory):
    """(transformers' MarianTokenizer, zoo's tokenizer, folder), one vocabulary or two."""
    folder = _marian_folder(
        tmp_path_factory.mktemp(f"marian-{request.param}"),
        spm_models,
        separate=request.param == "separate",
    )
    theirs = transformers.MarianTokenizer.from_pretrained(folder)
    ours = load_folder(folder)
    assert isinstance(ours, SentencePiecePair)
    return theirs, ours, folder


@pytest.fixture(scope="module")
def shared_folder(spm_models, tmp_path_factory) -> Path:
    return _marian_folder(tmp_path_factory.mktemp("marian-one"), spm_models, separate=False)


# -- Marian: ids and text equal MarianTokenizer's ---------------------------------------------
def test_marian_source_ids_equal_transformers(marian) -> None:
    theirs, ours, _ = marian
    for text in TEXTS:
        # zoo reads a special-token string in text as text unless allowed_special says
        # otherwise; transformers' split_special_tokens=True is the same rule
        want = theirs(text, split_special_tokens=True).input_ids
        assert ours.encode(text, add_special_tokens=True) == want, text[:60]
        assert ours.encode(text) == want[:-1] and want[-1] == ours.eos_id
        whole = theirs(text).input_ids  # transformers' default: special strings are tokens
        assert ours.encode(text, add_special_tokens=True, allowed_special="all") == whole


def test_marian_target_ids_equal_transformers(marian) -> None:
    theirs, ours, _ = marian
    for text in TEXTS:
        want = theirs(text_target=text, split_special_tokens=True).input_ids
        assert ours.encode_target(text, add_special_tokens=True) == want, text[:60]
        whole = theirs(text_target=text).input_ids
        assert ours.encode_target(text, add_special_tokens=True, allowed_special="all") == whole


def test_marian_decoding_equals_transformers(marian) -> None:
    """Target ids of held-out text and random ids (special ones among them), with and
    without skipping the special tokens."""
    theirs, ours, _ = marian
    rows = [theirs(text_target=text).input_ids for text in TEXTS if len(text) < 5000]
    draw = random.Random(0)
    specials = list(ours.special_tokens.values())
    for _ in range(60):
        rows.append([draw.randrange(ours.vocab_size) for _ in range(draw.randrange(1, 30))])
        rows.append([*rows[-1][:5], draw.choice(specials), *rows[-1][5:]])
    for ids in rows:
        for skip in (True, False):
            want = theirs.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip_special_tokens=skip) == want, (ids, skip)


def test_marian_roles_and_sizes(marian) -> None:
    theirs, ours, _ = marian
    assert (ours.eos_id, ours.pad_id, ours.unk_id) == (
        theirs.eos_token_id,
        theirs.pad_token_id,
        theirs.unk_token_id,
    )
    assert ours.bos_id is None  # Marian's decoder starts at decoder_start_token_id (pad)
    assert ours.end_ids == (theirs.eos_token_id,)
    target = theirs.target_encoder if theirs.separate_vocabs else theirs.encoder
    assert ours.vocab_size == len(target)
    assert ours.source_vocab_size == len(theirs.encoder)
    assert ours.source_special_tokens is True
    for token_id in (0, 1, 5, 17, ours.pad_id, ours.vocab_size - 2):
        assert ours.id_to_token(token_id) == theirs.convert_ids_to_tokens(token_id)


def test_marian_saved_and_exported_files_load_back(marian, tmp_path: Path) -> None:
    """zoo's save reads back as the same tokenizer; the Hugging Face files it writes load in
    transformers as a MarianTokenizer giving the same ids."""
    theirs, ours, _ = marian
    ours.save(tmp_path / "zoo")
    again = load_directory(tmp_path / "zoo")
    assert isinstance(again, SentencePiecePair) and again.fingerprint() == ours.fingerprint()
    hf = tmp_path / "hf"
    hf.mkdir()
    for name, data in ours.hf_files(model_max_length=64).items():
        (hf / name).write_bytes(data)
    back = transformers.AutoTokenizer.from_pretrained(hf)
    assert type(back).__name__ == "MarianTokenizer" and back.model_max_length == 64
    for text in TEXTS[:40]:
        assert back(text).input_ids == theirs(text).input_ids
        assert back(text_target=text).input_ids == theirs(text_target=text).input_ids


def test_marian_fingerprint_follows_the_files(marian, spm_models, tmp_path: Path) -> None:
    _, ours, folder = marian
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    assert load_folder(other).fingerprint() == ours.fingerprint()
    vocab = json.loads((other / "vocab.json").read_text())
    first, second = sorted(vocab, key=vocab.get)[5:7]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other / "vocab.json").write_text(json.dumps(vocab))
    assert load_folder(other).fingerprint() != ours.fingerprint()


def test_the_registered_marian_tokenizer_reads_a_folder(shared_folder: Path) -> None:
    made = zoo.tokenizer("marian-spm", directory=shared_folder)
    assert isinstance(made, SentencePiecePair)
    assert made.fingerprint() == zoo.tokenizer(str(shared_folder)).fingerprint()
    with pytest.raises(TokenizerUnavailableError, match="directory="):
        zoo.tokenizer("marian-spm")


# -- Marian: bad folders get clear errors ----------------------------------------------------
def _edited(folder: Path, where: Path, edit: Any) -> Path:
    copy = where / "edited"
    shutil.copytree(folder, copy)
    edit(copy)
    return copy


def _config_edit(**values: Any) -> Any:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config.update(values)
        (folder / "tokenizer_config.json").write_text(json.dumps(config))

    return edit


def _vocab_edit(change: Any) -> Any:
    def edit(folder: Path) -> None:
        vocab = json.loads((folder / "vocab.json").read_text())
        (folder / "vocab.json").write_text(json.dumps(change(vocab)))

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: (f / "target.spm").unlink(), "target.spm"),
        (_vocab_edit(lambda v: {k: i for k, i in v.items() if k != "<unk>"}), "unknown token"),
        (_vocab_edit(lambda v: {**v, "▁zzz": 3}), "share id 3"),
        (_vocab_edit(lambda v: {**v, "▁zzz": -4}), "non-negative"),
        (_vocab_edit(lambda v: [1, 2]), "not a JSON object"),
        (_config_edit(sp_model_kwargs={"enable_sampling": True}), "sp_model_kwargs"),
        (_config_edit(separate_vocabs="yes"), "separate_vocabs"),
        (_config_edit(separate_vocabs=True), "target_vocab.json"),
        (
            _config_edit(added_tokens_decoder={"3": {"content": "▁x", "special": False}}),
            "not special",
        ),
        (
            _config_edit(
                added_tokens_decoder={"3": {"content": "<x>", "special": True, "lstrip": True}}
            ),
            "lstrip",
        ),
    ],
)
def test_a_bad_marian_folder_is_refused_saying_what(
    shared_folder: Path, tmp_path: Path, edit: Any, message: str
) -> None:
    with pytest.raises(VocabularyFileError, match=message):
        load_folder(_edited(shared_folder, tmp_path, edit))


def _child(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter (a crash there fails the test, not the run)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO / "tests",
    )


def test_corrupted_models_are_refused_in_a_child_process(
    shared_folder: Path, tmp_path: Path
) -> None:
    """Garbage, a truncated model, an empty file and JSON as ``source.spm``: each a
    VocabularyFileError naming the file, none a crash."""
    good = (shared_folder / "source.spm").read_bytes()
    cases = {
        "garbage": bytes(random.Random(1).randrange(256) for _ in range(4096)),
        "truncated": good[: len(good) // 3],
        "empty": b"",
        "json": b'{"pieces": []}',
    }
    for name, data in cases.items():
        copy = tmp_path / name
        shutil.copytree(shared_folder, copy)
        (copy / "source.spm").write_bytes(data)
    result = _child(
        f"""
        from zoo.tokenizers import load_folder
        from zoo.tokenizers.errors import VocabularyFileError
        for name in {sorted(cases)!r}:
            try:
                load_folder({str(tmp_path)!r} + "/" + name)
            except VocabularyFileError as exc:
                assert "source.spm" in str(exc), exc
                print(name, "refused")
            else:
                print(name, "LOADED")
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [w for name in sorted(cases) for w in (name, "refused")]


def test_hostile_text_is_encoded_as_transformers_does_in_a_child_process(
    shared_folder: Path,
) -> None:
    """Very long text, control characters and unpaired pieces through the library in a child
    process, against transformers there."""
    result = _child(
        f"""
        import warnings
        warnings.filterwarnings("ignore")
        import transformers
        from zoo.tokenizers import load_folder
        ours = load_folder({str(shared_folder)!r})
        theirs = transformers.MarianTokenizer.from_pretrained({str(shared_folder)!r})
        texts = ["a" * 300000, "\\x00" * 100, "\\u2581" * 1000, "\\U0010ffff\\ufeff\\u200b",
                 ">>" * 5000, "<<>>" * 3000, " \\n " * 10000]
        for text in texts:
            want = theirs(text, split_special_tokens=True).input_ids
            assert ours.encode(text, add_special_tokens=True) == want, text[:20]
            assert ours.decode(want) == theirs.decode(want)
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_without_sentencepiece_the_error_names_the_extra(shared_folder: Path) -> None:
    """The library missing: reading the pair says which extra installs it, and a Marian
    checkpoint still loads, without its tokenizer and with that reason."""
    result = _child(
        f"""
        import sys
        sys.modules["sentencepiece"] = None  # as if it were not installed
        from zoo.tokenizers import load_folder
        from zoo.tokenizers.errors import TokenizerUnavailableError
        try:
            load_folder({str(shared_folder)!r})
        except TokenizerUnavailableError as exc:
            print(exc)
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "pip install 'torch-zoo[marian]'" in result.stdout


# -- T5 and BART: their tokenizer.json, read as written ------------------------------------------
@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A T5Tokenizer made from a trained SentencePiece model (pad 0, eos 1, unk 2, 100
    sentinels), saved by transformers (tokenizer.json)."""
    where = tmp_path_factory.mktemp("t5")
    model = _train_spm(
        HELD_IN_SOURCE, where / "spiece", 700, pad_id=0, eos_id=1, unk_id=2, bos_id=-1
    )
    spiece = where / "spm"
    spiece.mkdir()
    shutil.copy(model, spiece / "spiece.model")
    folder = where / "tokenizer"
    transformers.T5Tokenizer.from_pretrained(spiece).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bart_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BART's tokenizer over a byte-level BPE trained with the tokenizers library (its
    ``<mask>`` strips the space before it, as BART's does), saved by transformers."""
    from tokenizers import ByteLevelBPETokenizer

    where = tmp_path_factory.mktemp("bart")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        HELD_IN_SOURCE,
        vocab_size=600,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    bpe.save_model(str(where))
    folder = where / "tokenizer"
    transformers.BartTokenizer.from_pretrained(where).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_tokenizer_json_families_equal_transformers(family: str, request) -> None:
    folder = request.getfixturevalue(f"{family}_folder")
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = load_folder(folder)
    assert ours.source_special_tokens is True
    assert (ours.eos_id, ours.pad_id) == (theirs.eos_token_id, theirs.pad_token_id)
    for text in TEXTS:
        want = theirs(text).input_ids
        assert ours.encode(text, add_special_tokens=True, allowed_special="all") == want
        split = theirs(text, split_special_tokens=True).input_ids
        assert ours.encode(text, add_special_tokens=True) == split, text[:60]
        for skip in (True, False):
            if len(text) < 5000:
                assert ours.decode(want, skip_special_tokens=skip) == theirs.decode(
                    want, skip_special_tokens=skip
                )
    if family == "t5":  # the sentinels T5 adds after the SentencePiece model's pieces
        sentinel = theirs.convert_tokens_to_ids("<extra_id_0>")
        assert ours.special_tokens["<extra_id_0>"] == sentinel == len(theirs) - 1


def test_a_saved_tokenizer_keeps_the_source_rule(t5_folder: Path, tmp_path: Path) -> None:
    ours = load_folder(t5_folder)
    ours.save(tmp_path)
    assert load_directory(tmp_path).source_special_tokens is True


# -- zoo.load attaches each family's tokenizer; generation from text equals transformers' ----
def _marian_model(folder: Path, tokenizer: Any) -> Any:
    config = transformers.MarianConfig(
        vocab_size=len(tokenizer.encoder), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=0, forced_eos_token_id=None,
    )  # fmt: skip
    return transformers.MarianMTModel(config)


def _t5_model(folder: Path, tokenizer: Any) -> Any:
    config = transformers.T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config)


def _bart_model(folder: Path, tokenizer: Any) -> Any:
    config = transformers.BartConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=256,
    )  # fmt: skip
    return transformers.BartForConditionalGeneration(config)


MODELS = {"marian": _marian_model, "t5": _t5_model, "bart": _bart_model}


def _checkpoint(family: str, tokenizer_folder: Path, where: Path) -> tuple[Any, ...]:
    """(transformers' tokenizer and model, their save_pretrained folder, zoo's load of it)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder)
    torch.manual_seed(0)
    model = MODELS[family](tokenizer_folder, tokenizer).eval()
    randomize(model, std=0.3)
    model.save_pretrained(where)
    tokenizer.save_pretrained(where)
    return tokenizer, model, where, zoo.load(where)


@pytest.fixture(scope="module")
def marian_checkpoint(shared_folder, tmp_path_factory):
    return _checkpoint("marian", shared_folder, tmp_path_factory.mktemp("marian-checkpoint"))


@pytest.fixture(scope="module")
def t5_checkpoint(t5_folder, tmp_path_factory):
    return _checkpoint("t5", t5_folder, tmp_path_factory.mktemp("t5-checkpoint"))


@pytest.fixture(scope="module")
def bart_checkpoint(bart_folder, tmp_path_factory):
    return _checkpoint("bart", bart_folder, tmp_path_factory.mktemp("bart-checkpoint"))


def _target_text(tokenizer: Any, ids: torch.Tensor, end: int) -> str:
    """The text zoo gives for generated ``ids`` (start token first): the new tokens before
    the first end id, decoded (a special token the model picks, a T5 sentinel, is text)."""
    new = ids.tolist()[1:]
    return tokenizer.decode(new[: new.index(end)] if end in new else new)


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_generating_from_text_equals_transformers(family: str, num_beams: int, request) -> None:
    """The source is encoded as transformers' tokenizer encodes it (its ``</s>``, BART's
    ``<s>`` too) and the target decoded as it decodes: the text is transformers'
    ``generate`` of ``tokenizer(text)``, decoded."""
    tokenizer, theirs, _, model = request.getfixturevalue(f"{family}_checkpoint")
    assert model.tokenizer is not None, model.tokenizer_error
    assert isinstance(model.tokenizer, SentencePiecePair) == (family == "marian")
    settings = {"max_new_tokens": 10, "num_beams": num_beams, "no_repeat_ngram_size": 2}
    for text in [SOURCE, HELD_OUT[1]]:
        inputs = tokenizer(text, return_tensors="pt")
        want = theirs.generate(**inputs, do_sample=False, **settings)[0]
        got = zoo.generate(model, text, temperature=0, **settings)
        assert got == _target_text(tokenizer, want, tokenizer.eos_token_id), (family, text)
        ids = zoo.generate(model, inputs.input_ids, temperature=0, **settings)
        assert ids[0].tolist() == want.tolist()


def test_zoo_generate_prints_the_translation(marian_checkpoint) -> None:
    """``zoo generate FOLDER "text"`` on an encoder-decoder prints the target text alone (no
    echo of the source): transformers' greedy translation, decoded."""
    tokenizer, theirs, folder, _ = marian_checkpoint
    want = theirs.generate(
        **tokenizer(SOURCE, return_tensors="pt"), max_new_tokens=12, do_sample=False,
        no_repeat_ngram_size=2,
    )[0]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "generate", str(folder), SOURCE,
         "--max-new-tokens", "12", "--temperature", "0", "--no-repeat-ngram-size", "2"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == _target_text(tokenizer, want, tokenizer.eos_token_id) + "\n"


def test_a_marian_model_saved_and_exported_keeps_its_tokenizer(marian_checkpoint, tmp_path) -> None:
    tokenizer, _, _, model = marian_checkpoint
    zoo.save(model, tmp_path / "zoo")
    again = zoo.load(tmp_path / "zoo")
    assert again.tokenizer.fingerprint() == model.tokenizer.fingerprint()
    zoo.export(model, tmp_path / "hf")
    back = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(back).__name__ == "MarianTokenizer"
    assert back(SOURCE).input_ids == tokenizer(SOURCE).input_ids


def test_a_t5_folder_with_only_spiece_model_says_how_to_fix(t5_checkpoint, tmp_path) -> None:
    _, _, folder, _ = t5_checkpoint
    copy = tmp_path / "t5"
    shutil.copytree(folder, copy)
    (copy / "tokenizer.json").unlink()
    (copy / "spiece.model").write_bytes(b"\n\x00")  # the file's presence is what counts
    model = zoo.load(copy)
    assert model.tokenizer is None and "tokenizer.json" in model.tokenizer_error
    assert "save_pretrained" in model.tokenizer_error


def test_a_marian_repo_on_the_hub_brings_its_sentencepiece_pair(
    marian, local_hub, tmp_path: Path
) -> None:
    """``zoo.load("hf:...")`` of an OPUS-MT-like repo fetches ``source.spm``, ``target.spm``,
    ``vocab.json`` (and ``target_vocab.json`` with two vocabularies) beside the weights, so the
    model arrives with the tokenizer a folder load gives it."""
    theirs, ours, folder = marian
    vocab = max(ours.vocab_size, theirs.vocab_size)
    config = transformers.MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, pad_token_id=theirs.pad_token_id,
        decoder_start_token_id=theirs.pad_token_id, eos_token_id=theirs.eos_token_id,
        d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, share_encoder_decoder_embeddings=True,
    )  # fmt: skip
    repo = tmp_path / "repo"
    transformers.MarianMTModel(config).save_pretrained(repo)
    files = {p.name: p for p in [*repo.iterdir(), *folder.iterdir()]}
    local_hub.add_files("org/opus-mt-tiny", files, message="seed")
    model = zoo.load("hf:org/opus-mt-tiny")
    assert isinstance(model.tokenizer, SentencePiecePair), model.tokenizer_error
    line = HELD_OUT[0]
    assert model.tokenizer.encode(line, add_special_tokens=True) == theirs(line).input_ids
