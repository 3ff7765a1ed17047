"""The ``README.md`` model card :func:`zoo.push` writes: YAML metadata for the Hub
(``library_name: zoo``, tags, licence; for a LoRA adapter ``library_name: peft``, tag ``lora``
and ``base_model``) and, for a reader, what the model is and how to load it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..checkpoint.manifest import Manifest, plugin_distribution
from ..errors import ZooError
from ..plugin.current import get_registry

__all__ = ["DEFAULT_LICENSE", "adapter_card", "model_card"]

#: Licence id written when the caller gives none: zoo cannot know the weights' licence.
DEFAULT_LICENSE = "other"


def _architecture_facts(name: str) -> tuple[str, tuple[str, ...], str | None]:
    """``(description, blocks, supplying plugin)`` of an installed architecture, or blanks."""
    registry = get_registry()
    try:
        arch = registry.architecture(name)
        return arch.description, arch.blocks, registry.source("architecture", name)
    except ZooError:
        return "", (), None


def _install_line(manifest: Manifest) -> str:
    """``pip install torch-zoo [the plugin's distribution]``."""
    from .._version import DISTRIBUTION

    name = plugin_distribution(manifest.plugin)
    return f"pip install {DISTRIBUTION}" + (f" {name}" if name and name != DISTRIBUTION else "")


def _weights_text(manifest: Manifest) -> str:
    text = f"`{manifest.weights_file}`, sha256 `{manifest.sha256 or 'not recorded'}`"
    if manifest.shards:
        text += f"; {len(manifest.shards)} shards, each sha256 recorded in `config.json`"
    return text


def model_card(manifest: Manifest, repo_id: str, *, license: str = DEFAULT_LICENSE) -> str:
    """The model card for a checkpoint described by ``manifest``, pushed to ``repo_id``."""
    from huggingface_hub import ModelCardData

    description, blocks, plugin = _architecture_facts(manifest.architecture)
    config = dict(manifest.config)
    tags = ["zoo", "pytorch", "safetensors", manifest.architecture]
    if manifest.model_name and manifest.model_name not in tags:
        tags.append(manifest.model_name)
    metadata = ModelCardData(library_name="zoo", license=license, tags=tags).to_yaml()

    tokenizer = manifest.tokenizer or {}
    if tokenizer.get("files"):
        tokenizer_text = (
            f"`{tokenizer['name']}` (files in this repo: {', '.join(tokenizer['files'])})"
        )
    elif tokenizer.get("name"):
        tokenizer_text = f"`{tokenizer['name']}` (supplied by its plugin)"
    else:
        tokenizer_text = "none saved"
    parameters = f"{manifest.parameters:,}" if manifest.parameters is not None else "unknown"
    rows = [
        (
            "architecture",
            f"`{manifest.architecture}`" + (f" ({description})" if description else ""),
        ),
        ("supplied by", plugin or "a plugin that is not installed where this card was written"),
        ("named model", f"`{manifest.model_name}`" if manifest.model_name else "-"),
        ("components", "; ".join(blocks) or "-"),
        ("positions", str(config.get("positions", "-"))),
        ("parameters", parameters),
        ("dtype", manifest.dtype or "-"),
        ("tokenizer", tokenizer_text),
        ("weights", _weights_text(manifest)),
        ("zoo version", manifest.zoo_version or "-"),
    ]
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    title = repo_id.split("/")[-1]
    kind = "sharded safetensors" if manifest.shards else "safetensors"
    return f"""---
{metadata}
---

# {title}

A checkpoint of zoo, the plugin-based PyTorch model zoo: weights in `{manifest.weights_file}`
({kind}), architecture and config in `config.json`. Loading it runs no code from this
repo: the architecture comes from an installed zoo plugin.

| | |
|---|---|
{table}

## Usage

```sh
{_install_line(manifest)}
zoo pull {repo_id}
```

```python
import zoo

model = zoo.load("hf:{repo_id}")          # or "hf:{repo_id}@<revision>"
model.tokenizer                          # when one was saved with the weights
```

## Config

```json
{json.dumps(config, indent=2)}
```
"""


def _base_repo(base: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    """The Hub repo of an adapter's base, for the card's ``base_model``: the repo zoo's record
    names, else its named model's weights repo (the registry's), else (an adapter peft wrote)
    peft's ``base_model_name_or_path`` when it is a repo id, else ``None``."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo = base.get("repo")
    if isinstance(repo, str) and repo:
        return repo
    named = config.get("base_model_name_or_path")
    if not base and isinstance(named, str) and named.count("/") == 1:
        try:
            validate_repo_id(named)
        except HFValidationError:
            return None
        return named
    name = base.get("name")
    registry = get_registry()
    if isinstance(name, str) and name in registry:
        weights = registry.model(name).weights
        return weights.repo if weights is not None and weights.repo else None
    return None


def adapter_card(
    config: Mapping[str, Any],
    base: Mapping[str, Any],
    repo_id: str,
    *,
    license: str = DEFAULT_LICENSE,
) -> str:
    """The model card of a LoRA adapter pushed to ``repo_id``: the Hub's adapter metadata
    (``base_model``, ``library_name: peft``, tags ``lora``), the base it was trained on (name,
    repo, revision, sha256 from ``base``) and its shape (from peft's ``config``)."""
    from huggingface_hub import ModelCardData

    base_repo = _base_repo(base, config)
    tags = ["lora", "peft", "zoo", "safetensors"]
    metadata = ModelCardData(
        library_name="peft", license=license, tags=tags, base_model=base_repo
    ).to_yaml()
    targets = config.get("target_modules")
    shown_targets = (
        ", ".join(map(str, targets)) if isinstance(targets, list) else str(targets or "-")
    )
    rows = [
        ("base model", f"`{base.get('name')}`" if base.get("name") else "-"),
        ("base repo", f"`{base_repo}`" if base_repo else "-"),
        ("base revision", f"`{base.get('revision')}`" if base.get("revision") else "-"),
        ("base sha256", f"`{base.get('sha256')}`" if base.get("sha256") else "not recorded"),
        ("rank", str(config.get("r", "-"))),
        ("alpha", str(config.get("lora_alpha", "-"))),
        ("targets", shown_targets),
    ]
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    title = repo_id.split("/")[-1]
    base_arg = base.get("name") or (f"hf:{base_repo}" if base_repo else "BASE")
    check = (
        "zoo checks the base's weights against the sha256 recorded here before applying it, "
        "and refuses another base."
        if base.get("sha256")
        else "No fingerprint of the base is recorded: apply it to the base named here."
    )
    return f"""---
{metadata}
---

# {title}

A LoRA adapter (`adapter_config.json`, `adapter_model.safetensors`, as peft writes them) for
the base model below. {check}

| | |
|---|---|
{table}

## Usage

```python
import zoo

model = zoo.load("{base_arg}", adapter="hf:{repo_id}")
merged = zoo.merge("{base_arg}", "hf:{repo_id}")   # the adapter folded into the weights
```

```sh
zoo generate {base_arg} "Hello" --adapter hf:{repo_id}
```

With peft: `PeftModel.from_pretrained(base_model, "{repo_id}")`.
"""
