"""Named adapters (``zoo.load(SOURCE, adapter=ADAPTER)`` where the adapter may be a named
one): a plugin's ``zoo_adapters`` (or a registry file's ``[adapters.NAME]``)
declares an adapter's name, its named base and its pinned Hub repo; ``zoo.load(NAME)``,
``zoo.load(BASE, adapter=NAME)``, ``zoo generate NAME``, ``--adapter NAME``, ``zoo info`` and
``zoo list`` use it; another base, a wrong pin and a name a model claims too are refused. The
adapter repo is served by the local hub."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hubserver import LocalHub
from test_adapters_use import IDS, _adapter

import zoo
from zoo.checkpoint.files import sha256_file
from zoo.cli import main
from zoo.plugin.current import load_registry, read_registry_file
from zoo.plugin.specs import AdapterSpec

FILES = ("adapter_config.json", "adapter_model.safetensors")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``llama-tiny``'s weights in a ``$ZOO_WEIGHTS_DIR`` and an adapter recording that
    name, with its adapted logits."""
    root = tmp_path_factory.mktemp("named")
    torch.manual_seed(0)
    base = zoo.save(zoo.build("llama-tiny").eval(), root / "weights" / "llama-tiny")
    logits = _adapter(base, root / "adapter", name="llama-tiny")
    sha = sha256_file(root / "adapter" / FILES[1])
    return {"root": root, "adapter": root / "adapter", "logits": logits, "sha256": sha}


@pytest.fixture
def hub(
    made: dict[str, Any],
    local_hub: LocalHub,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    use_registry: Callable[[Any], Any],
) -> Callable[..., str]:
    """``declare(**fields)``: the adapter pushed to the local hub as ``org/tiny-lora`` and a
    plugin declaring ``tiny-lora`` (for ``llama-tiny``, pinned to that commit and sha256;
    ``fields`` override) made the registry in use; returns the commit."""
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(made["root"] / "weights"))
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))
    commit = local_hub.add_files("org/tiny-lora", {f: made["adapter"] / f for f in FILES})

    def declare(prefer: tuple[str, ...] = (), **fields: Any) -> str:
        spec = {"name": "tiny-lora", "base": "llama-tiny", "repo": "org/tiny-lora"}
        spec |= {"revision": commit, "sha256": made["sha256"], **fields}

        class Plugin:
            @zoo.hookimpl
            def zoo_adapters(self) -> list[AdapterSpec]:
                return [AdapterSpec(**spec)]

        use_registry(load_registry(plugins={"poems": Plugin()}, prefer=prefer))
        return commit

    return declare


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)


def test_a_named_adapter_loads_alone_or_with_its_base(
    made: dict, hub: Callable, local_hub: LocalHub, hub_offline: Callable[[bool], None]
) -> None:
    hub()
    assert torch.equal(_logits(zoo.load("tiny-lora")), made["logits"])
    hub_offline(True)  # pinned and cached: the same adapter, no request to the Hub
    seen = len(local_hub.requests)
    assert torch.equal(_logits(zoo.load("llama-tiny", adapter="tiny-lora")), made["logits"])
    assert len(local_hub.requests) == seen
    merged = zoo.merge("llama-tiny", "tiny-lora")
    torch.testing.assert_close(_logits(merged), made["logits"], atol=1e-5, rtol=1e-5)


def test_a_named_adapter_with_another_base_is_refused_naming_both(hub: Callable) -> None:
    hub()
    with pytest.raises(ValueError, match=r"'tiny-lora' is for base model 'llama-tiny', not 'gpt2'"):
        zoo.load("gpt2", adapter="tiny-lora")
    with pytest.raises(zoo.UnknownModelError, match=r"LoRA adapter of 'llama-tiny'"):
        zoo.build("tiny-lora")  # an adapter is no model


def test_a_pin_the_hub_contradicts_is_refused(local_hub: LocalHub, hub: Callable) -> None:
    hub(sha256="0" * 64)
    with pytest.raises(zoo.ChecksumMismatchError, match="registry's pin for tiny-lora"):
        zoo.load("tiny-lora")
    assert not any("adapter_model" in r for r in map(str, local_hub.requests))


def test_cli_generate_info_and_list(
    made: dict, hub: Callable, capsys: pytest.CaptureFixture[str]
) -> None:
    hub(description="tiny poems")
    assert (
        main(["generate", "tiny-lora", "Once", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    )
    alone = capsys.readouterr().out
    flag = ["generate", "llama-tiny", "Once", "--max-new-tokens", "6", "--temperature", "0"]
    assert main([*flag, "--adapter", "tiny-lora"]) == 0
    assert capsys.readouterr().out == alone
    assert main(["info", "tiny-lora"]) == 0
    out = capsys.readouterr().out
    assert "tiny-lora: a LoRA adapter of llama-tiny, pinned at hf:org/tiny-lora@" in out
    assert "tiny poems" in out and "llama" in out
    assert main(["list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "tiny-lora" in line)
    assert "LoRA adapter of llama-tiny" in row and "tiny poems" in row
    assert main([*flag[:2], "x", "--adapter", "no-such-thing"]) == 2
    capsys.readouterr()
    assert main(["merge", "tiny-lora", "tiny-lora", "out"]) == 2  # a base must be a model
    assert "'tiny-lora' is a LoRA adapter of 'llama-tiny', not a model" in capsys.readouterr().err


def test_a_name_a_model_and_an_adapter_claim_is_a_conflict(hub: Callable) -> None:
    hub(name="gpt2")  # an alias of gpt2-124m
    with pytest.raises(zoo.RegistryConflictError, match=r"'gpt2' is claimed by more") as raised:
        zoo.load("gpt2")
    assert "plugin poems" in str(raised.value) and "registry.toml" in str(raised.value)
    with pytest.raises(zoo.RegistryConflictError):
        zoo.build("gpt2")
    assert "model gpt2" in zoo.get_registry().conflicts
    hub(name="gpt2", prefer=("poems",))  # ZOO_PREFER settles it, as between two models
    assert zoo.get_registry().is_adapter("gpt2") and not zoo.get_registry().conflicts


def test_a_registry_file_declares_adapters(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(
        '[adapters.tiny-lora]\nbase = "llama-tiny"\nrepo = "org/tiny-lora"\nrevision = "v1"\n'
    )
    (spec,) = read_registry_file(good)
    assert spec == AdapterSpec("tiny-lora", base="llama-tiny", repo="org/tiny-lora", revision="v1")
    registry = load_registry(registry_files=[good], entry_points=False)
    assert registry.adapters() == ["tiny-lora"] and registry.source("adapter", "tiny-lora") == str(
        good
    )
    for table, says in (
        ('base = "llama-tiny"', "'repo' required"),
        ('base = "llama-tiny"\nrepo = "../x"', "not a Hub repo id"),
        ('base = "llama-tiny"\nrepo = "o/x"\nsha256 = "abc"', "is not a sha256"),
        ('base = "llama-tiny"\nrepo = "o/x"\nlayout = "hf"', "unknown key"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(f"[adapters.x]\n{table}\n")
        with pytest.raises(zoo.ZooError, match=says):
            read_registry_file(bad)
