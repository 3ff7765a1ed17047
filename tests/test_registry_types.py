"""What the registry says about names that are not what they seem: two
plugins reading one Hugging Face ``model_type`` are a conflict as two claiming one name are;
an architecture's name where a model's is wanted says how to build one; ``zoo info`` shows
the block a config declares."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from zoo_plugins.gpt_neox.config import GPTNeoXConfig

import zoo
from zoo.cli import main
from zoo.errors import CheckpointError, RegistryConflictError, UnknownModelError
from zoo.plugin.current import load_registry

NEOX_FILE = {
    "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": 300,
    "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
    "intermediate_size": 128, "max_position_embeddings": 64,
}  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class CopyConfig(GPTNeoXConfig):
    """A second plugin's GPT-NeoX."""

    architecture: ClassVar[str] = "neox-copy"


class _Copy:
    """A plugin whose architecture reads Hugging Face ``gpt_neox`` folders too."""

    @zoo.hookimpl
    def zoo_architectures(self) -> list[zoo.ArchitectureSpec]:
        return [
            zoo.ArchitectureSpec(
                name="neox-copy", config=CopyConfig, model="zoo.nn.decoder:DecoderLM",
                description="GPT-NeoX again",
                checkpoint_layouts={"hf-copy": "zoo_plugins.gpt_neox.convert:HF_GPT_NEOX"},
            )
        ]  # fmt: skip


@pytest.fixture
def neox_folder(tmp_path: Path) -> Path:
    """A Hugging Face GPT-NeoX folder: config.json and weights."""
    zoo.export(zoo.build(GPTNeoXConfig(**_tiny())), tmp_path / "neox")
    return tmp_path / "neox"


def test_two_plugins_reading_one_model_type_are_a_conflict(
    neox_folder: Path, monkeypatch: pytest.MonkeyPatch, use_registry: Any, capsys: Any
) -> None:
    """Before: zoo.load of the folder silently took whichever layout came first."""
    from zoo.checkpoint import load_local

    monkeypatch.delenv("ZOO_PREFER", raising=False)
    use_registry(load_registry(plugins={"copy": _Copy()}))
    message = (
        r"model_type 'gpt_neox' is read by more than one installed layout: layout "
        r"'hf-gpt-neox' of architecture 'gpt-neox' \(plugin gpt_neox\) and layout 'hf-copy' "
        r"of architecture 'neox-copy' \(plugin copy\)\. zoo never picks one silently: .*"
        r"ZOO_PREFER \(e\.g\. ZOO_PREFER=gpt_neox\).*layout='hf-gpt-neox'"
    )
    with pytest.raises(RegistryConflictError, match=message):
        zoo.load(neox_folder)
    with pytest.raises(RegistryConflictError, match=message):
        zoo.info(str(neox_folder))
    # naming the layout settles it, as ZOO_PREFER does
    chosen = load_local(neox_folder, layout="hf-copy", tokenizer=False)
    assert type(chosen.config).architecture == "neox-copy"
    assert main(["plugins"]) == 0  # `zoo plugins` lists it with the name conflicts
    assert re.search(rf"^conflict: Hugging Face {message}", capsys.readouterr().out, re.M)
    for prefer, architecture in (("copy", "neox-copy"), ("gpt_neox", "gpt-neox")):
        use_registry(load_registry(plugins={"copy": _Copy()}, prefer=[prefer]))
        assert type(zoo.load(neox_folder).config).architecture == architecture
        main(["plugins"])
        assert "conflict: Hugging Face" not in capsys.readouterr().out


def test_an_architecture_name_says_how_to_build_one() -> None:
    """Before: "unknown model 'gpt-neox'"."""
    with pytest.raises(UnknownModelError) as caught:
        zoo.build("gpt-neox", device="meta")
    message = str(caught.value)
    assert message.startswith("'gpt-neox' is an architecture, not a named model.")
    assert "zoo.build('pythia-160m', n_layers=2)" in message
    assert "zoo.build(GPTNeoXConfig(...)), GPTNeoXConfig from zoo_plugins.gpt_neox" in message
    assert zoo.build(GPTNeoXConfig(**_tiny()), device="meta") is not None  # as it says


def _tiny() -> dict[str, Any]:
    return dict(vocab_size=300, context_length=64, d_model=64, n_heads=4, n_layers=2, d_ff=128)


def test_info_shows_the_block_a_config_declares(tmp_path: Path, capsys: Any) -> None:
    """Before: a post_branch (OLMo-2) model showed as "pre-LN, x + f(norm(x))"."""
    from zoo_plugins.llama.config import LlamaConfig

    config = LlamaConfig(**_tiny(), block="post_branch", qk_norm=True, qk_norm_scope="full")
    zoo.save(zoo.build(config), tmp_path / "olmo-like")
    assert main(["info", str(tmp_path / "olmo-like")]) == 0
    out = capsys.readouterr().out
    blocks = re.search(r"^  blocks +(.*)$", out, re.M)
    assert blocks is not None, out
    assert blocks[1].startswith(
        "2 blocks (post_branch: x + norm(f(x)): each branch normed inside the residual (OLMo-2))"
    )
    assert "rmsnorm on the queries and keys, across all heads" in blocks[1]
    assert "pre-LN" not in out and re.search(
        r"^  block +post_branch \(from plugin zoo\)$", out, re.M
    )


def test_a_layout_that_is_not_the_folders_is_still_refused(neox_folder: Path) -> None:
    """One plugin reading the model type: a layout asked for that is not the folder's is
    refused as before, not mistaken for a choice between claimants."""
    from zoo.checkpoint import load_local

    with pytest.raises(CheckpointError, match="holds a 'hf-gpt-neox' checkpoint, not 'hf-x'"):
        load_local(neox_folder, layout="hf-x")
