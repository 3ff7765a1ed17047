"""The named models of the new families, fetched as a user fetches them: from their official
repo ids through zoo's Hub client, here the local Hub emulator (no network), tokenizer files
included. The emulator's repo holds a tiny checkpoint written by transformers (sharded for
Mistral, as the real one is), the tokenizer folder of the model's chat template and end ids,
and the named model's own tokenizer factory reads it at the commit the repo got."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from chat_folders import write_folder
from hub_fixtures import set_offline
from parity import padded_batch
from test_families import reference

import zoo
from zoo.plugin.current import load_registry

#: named model -> (family in test_families, chat folder of tests/chat_folders, template?,
#: the plugin module declaring its tokenizer)
CASES: dict[str, tuple[str, str, bool, str]] = {
    "qwen2.5-0.5b-instruct": ("qwen2", "qwen2.5-instruct", True, "zoo_plugins.qwen2"),
    "qwen3-0.6b": ("qwen3", "qwen3", True, "zoo_plugins.qwen3"),
    "smollm2-135m-instruct": ("smollm2-like", "smollm2-instruct", True, "zoo_plugins.llama"),
    "mistral-7b-v0.3": ("mistral", "mistral-instruct-v0.3", False, "zoo_plugins.mistral"),
    "mixtral-8x7b": ("mixtral", "mistral-instruct-v0.3", False, "zoo_plugins.mixtral"),
    "pythia-160m": ("gpt-neox", "qwen2.5-instruct", False, "zoo_plugins.gpt_neox"),
}  # fmt: skip

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


class _Tiny:
    """The named model at a tiny size, from the same repo, layout and tokenizer."""

    def __init__(self, spec: zoo.ModelSpec, config: dict[str, Any], commit: str) -> None:
        source = spec.weights
        weights = zoo.WeightsSource(
            repo=source.repo, revision=commit, filename=source.filename, layout=source.layout
        )
        self.spec = zoo.ModelSpec(
            name="family-under-test",
            architecture=spec.architecture,
            tokenizer=spec.tokenizer,
            config=config,
            weights=weights,
        )

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        return [self.spec]


def _pin_tokenizer(monkeypatch: pytest.MonkeyPatch, module: str, name: str, commit: str) -> None:
    """The family plugin ``module`` declares its repo tokenizer ``name`` at ``commit`` (the
    local Hub's) instead of its pinned revision, for the registries loaded from now on."""
    plugin = importlib.import_module(module)
    declared = tuple(
        dataclasses.replace(t, factory=dataclasses.replace(t.factory, revision=commit))
        if t.name == name
        else t
        for t in plugin.family.tokenizers
    )
    # the entry point names the module's ``family``: the registries loaded from now on get this
    monkeypatch.setattr(plugin, "family", dataclasses.replace(plugin.family, tokenizers=declared))


@pytest.mark.parametrize("name", list(CASES))
def test_named_model_loads_from_its_hub_repo_with_its_tokenizer(
    name: str, local_hub: Any, use_registry: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    family, chat, has_template, module = CASES[name]
    arch, spec, _ = zoo.get_registry().resolve(name)
    folder = tmp_path / "repo"
    ref = reference(family, folder)
    if spec.weights.filename.endswith(".index.json"):  # sharded on the Hub: sharded here too
        for old in folder.glob("model*.safetensors*"):
            old.unlink()
        ref.save_pretrained(folder, max_shard_size="60KB")
        assert len(list(folder.glob("model-*-of-*.safetensors"))) >= 3
    write_folder(folder, chat, template=None if has_template else "")
    commit = local_hub.add_files(spec.weights.repo, {p.name: p for p in folder.iterdir()})
    _pin_tokenizer(monkeypatch, module, spec.tokenizer, commit)
    layout = arch.checkpoint_layout(spec.weights.layout)
    config = layout.config_from_foreign(json.loads((folder / "config.json").read_text()))
    use_registry(load_registry(plugins={"tiny": _Tiny(spec, config, commit)}))

    model = zoo.load("family-under-test")
    ids, _ = padded_batch(300)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids).logits, rtol=0, atol=1e-5)
    tokenizer = model.tokenizer
    assert tokenizer is not None and tokenizer.name == spec.tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    text = "Hello, ünïcode world"
    assert tokenizer.encode(text) == theirs(text, add_special_tokens=False).input_ids
    if has_template:
        want = theirs.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
        assert tokenizer.apply_chat_template(CHAT, add_generation_prompt=True) == want
        want_ids = theirs.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
        got_ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
        assert got_ids == list(getattr(want_ids, "input_ids", want_ids))
        ends = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
        assert list(tokenizer.end_ids) == (ends if isinstance(ends, list) else [ends])

    alone = zoo.tokenizer(spec.tokenizer)  # the factory alone: the repo's files at its pin
    assert alone.encode(text) == tokenizer.encode(text) and alone.end_ids == tokenizer.end_ids
    set_offline(monkeypatch)  # everything is cached now: the same model without the Hub
    again = zoo.load("family-under-test")
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
    assert zoo.tokenizer(spec.tokenizer).encode(text) == tokenizer.encode(text)
