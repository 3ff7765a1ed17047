"""The ``README.md`` model card :func:`zoo.push` writes: YAML metadata for the Hub
(``library_name: zoo``, tags, licence) and, for a reader, what the model is and how to load it.
"""

from __future__ import annotations

import json

from ..checkpoint.manifest import Manifest, plugin_distribution
from ..errors import ZooError
from ..plugin.registry import get_registry

__all__ = ["DEFAULT_LICENSE", "model_card"]

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
