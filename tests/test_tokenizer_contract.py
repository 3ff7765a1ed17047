"""The tokenizer-factory contract: what zoo.load passes a factory, and a model loaded without
its tokenizer says why."""

from __future__ import annotations

from pathlib import Path

import pytest

import zoo
import zoo.plugin.current
from zoo.plugin.current import load_registry

SMALL = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64}
calls: list[dict] = []


def cache_factory(directory=None):
    """A third-party factory whose `directory` means its own cache folder, not a checkpoint."""
    calls.append({"directory": directory})
    if directory is not None:
        raise RuntimeError(f"{directory} is not my cache")
    return zoo.tokenizer("gpt2-bpe")


def none_factory():
    return None


def broken_factory():
    """Cannot make its tokenizer here, and says so as the contract asks."""
    raise zoo.tokenizers.TokenizerUnavailableError("vocabulary server is down")


def unreadable_factory():
    raise FileNotFoundError("no such vocabulary file: vocab.json")


def buggy_factory():
    """A bug in a factory (here a TypeError) is a bug, not a tokenizer that cannot be made."""
    return len(3)  # type: ignore[arg-type]


def raw_factory():
    """Returns the `tokenizers` library's own object instead of a zoo tokenizer."""
    import tokenizers

    return tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, "[UNK]"))


def no_directory_factory():
    """Declared reads_checkpoint=True, but takes no directory."""
    return zoo.tokenizer("gpt2-bpe")


class Plugin:
    @zoo.hookimpl
    def zoo_tokenizers(self):
        return [
            zoo.TokenizerSpec(name="cache-tok", factory=f"{__name__}:cache_factory"),
            zoo.TokenizerSpec(name="none-tok", factory=f"{__name__}:none_factory"),
            zoo.TokenizerSpec(name="broken-tok", factory=f"{__name__}:broken_factory"),
            zoo.TokenizerSpec(name="unreadable-tok", factory=f"{__name__}:unreadable_factory"),
            zoo.TokenizerSpec(name="buggy-tok", factory=f"{__name__}:buggy_factory"),
            zoo.TokenizerSpec(name="raw-tok", factory=f"{__name__}:raw_factory"),
            zoo.TokenizerSpec(
                name="nodir-tok", factory=f"{__name__}:no_directory_factory", reads_checkpoint=True
            ),
        ]

    @zoo.hookimpl
    def zoo_models(self):
        # no vocab_size in the config: the architecture's default (50257) applies
        return [
            zoo.ModelSpec(name=f"with-{t}", architecture="gpt2", tokenizer=t)
            for t in (
                "cache-tok",
                "none-tok",
                "broken-tok",
                "unreadable-tok",
                "buggy-tok",
                "raw-tok",
                "nodir-tok",
            )
        ]


@pytest.fixture(autouse=True)
def _registry(monkeypatch, use_registry):
    use_registry(load_registry(plugins={"contract": Plugin()}))
    calls.clear()


def _saved(name: str, tmp_path: Path) -> Path:
    zoo.save(zoo.build(name, **SMALL), tmp_path)
    return tmp_path


def test_a_factory_gets_no_checkpoint_directory_unless_it_reads_checkpoints(tmp_path):
    model = zoo.load(_saved("with-cache-tok", tmp_path))
    assert calls == [{"directory": None}]
    assert model.tokenizer is not None and model.tokenizer_error is None


def test_a_model_spec_without_vocab_size_still_gets_its_tokenizer(tmp_path):
    model = zoo.load(_saved("with-cache-tok", tmp_path))
    assert model.tokenizer.name == "gpt2-bpe"


def test_a_factory_returning_none_breaks_the_contract_loudly():
    with pytest.raises(zoo.tokenizers.TokenizerError, match="returned None"):
        zoo.tokenizer("none-tok")


def test_a_factory_returning_something_else_than_a_tokenizer_is_refused():
    """A raw `tokenizers.Tokenizer` used to be returned as is, then failed in generate with
    AttributeError: 'tokenizers.Tokenizer' object has no attribute 'vocab_size'."""
    with pytest.raises(
        zoo.tokenizers.TokenizerError,
        match=r"'raw-tok' returned a tokenizers\.Tokenizer.*vocab_size.*HFTokenizer",
    ):
        zoo.tokenizer("raw-tok")


def test_a_factory_called_with_keywords_it_does_not_take_says_so():
    """reads_checkpoint=True on a factory without `directory`: zoo.load used to record only
    "no_directory_factory() got an unexpected keyword argument 'directory'"."""
    with pytest.raises(
        zoo.tokenizers.TokenizerError,
        match=r"'nodir-tok' cannot be called with directory=.*reads_checkpoint=True",
    ):
        zoo.tokenizer("nodir-tok", directory="x")
    with pytest.raises(zoo.tokenizers.TokenizerError, match=r"cannot be called with size="):
        zoo.tokenizer("cache-tok", size=3)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("broken-tok", "server is down"),
        ("unreadable-tok", "no such vocabulary file"),
        ("none-tok", "None"),
        ("raw-tok", "returned a tokenizers.Tokenizer"),
        ("nodir-tok", "cannot be called with directory="),
    ],
)
def test_loaded_without_its_tokenizer_is_an_explained_state(tmp_path, name, reason):
    model = zoo.load(_saved(f"with-{name}", tmp_path))
    assert model.tokenizer is None and reason in model.tokenizer_error
    with pytest.raises(ValueError, match=f"loaded without its tokenizer: .*{reason}"):
        zoo.generate(model, "Hello", max_new_tokens=2)
    assert len(zoo.generate(model, [1, 2], max_new_tokens=2)) == 4  # ids still work


def test_loading_warns_when_the_tokenizer_cannot_be_made(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="zoo.checkpoint"):
        zoo.load(_saved("with-broken-tok", tmp_path))
    assert "model loaded without its tokenizer: vocabulary server is down" in caplog.text


def test_a_bug_in_a_tokenizer_factory_is_not_turned_into_a_warning(tmp_path):
    """Only the expected failures (zoo's errors, unreadable files) leave a model without its
    tokenizer; a bug raised from a factory used to be a warning and model.tokenizer_error."""
    saved = _saved("with-buggy-tok", tmp_path)
    with pytest.raises(TypeError, match="has no len"):
        zoo.load(saved)


def test_tokenizer_false_is_recorded(tmp_path):
    model = zoo.load(_saved("with-cache-tok", tmp_path), tokenizer=False)
    assert model.tokenizer is None and model.tokenizer_error == "loaded with tokenizer=False"


def test_the_built_in_directory_readers_declare_it():
    registry = zoo.plugin.current.load_registry()
    assert registry.tokenizer("gpt1-bpe").reads_checkpoint
    assert registry.tokenizer("subword-bpe").reads_checkpoint
    # gpt2-bpe reads a Hugging Face folder's vocab.json + merges.txt or tokenizer.json only
    # to check they are GPT-2's (its ranks are shipped)
    assert registry.tokenizer("gpt2-bpe").checkpoint_file_sets == (
        ("vocab.json", "merges.txt"),
        ("tokenizer.json",),
    )
