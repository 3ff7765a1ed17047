"""A Hugging Face family of the shared decoder, declared in one call.

Most families zoo reads are :class:`zoo.nn.DecoderLM` with other settings: a config class, a
checkpoint layout, and the tokenizer of the model's Hub repo. :func:`declare_family` turns
those into the plugin's hooks, so a family plugin's ``__init__.py`` says only what differs,
and its entry point names the object (``qwen3 = "zoo_plugins.qwen3:family"`` under
``[project.entry-points.zoo]``)::

    from zoo.plugin.family import declare_family

    from .config import Qwen3Config

    family = declare_family(
        Qwen3Config,
        layout=("qwen3", "zoo_plugins.qwen3.convert:HF_QWEN3"),
        description="Qwen3: Llama with q/k norms and head_dim apart from the width",
        repo="Qwen/Qwen3-0.6B", revision="c1899de289a04d12100db370d81485cdf75e47ca",
        tokenizer_description="Qwen3 byte-level BPE with its chat template",
    )

Named models are data: zoo's own live in ``registry.toml``, a plugin's own in its
``zoo_models`` hook or a registry file of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .hookspecs import hookimpl
from .specs import ArchitectureSpec, TokenizerSpec
from .tokenizer_specs import repo_tokenizer_spec

__all__ = ["Family", "declare_family"]

#: The model class every family of the shared decoder builds.
DECODER = "zoo.nn.decoder:DecoderLM"


@dataclasses.dataclass(frozen=True)
class Family:
    """A family's specs and the hooks that return them: the plugin itself, named by an entry
    point (``"package.module:family"``) or passed to ``zoo.add_plugin``."""

    architecture: ArchitectureSpec
    tokenizers: tuple[TokenizerSpec, ...] = ()

    @hookimpl
    def zoo_architectures(self) -> list[ArchitectureSpec]:
        """The family's architecture."""
        return [self.architecture]

    @hookimpl
    def zoo_tokenizers(self) -> list[TokenizerSpec]:
        """The family's tokenizers."""
        return list(self.tokenizers)


def _reference(cls: type) -> str:
    """The lazy ``"module:Class"`` reference to ``cls``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def declare_family(
    config: type,
    *,
    layout: tuple[str, str],
    description: str,
    repo: str | None = None,
    revision: str = "main",
    tokenizer: str | None = None,
    tokenizer_description: str = "",
    tokenizer_files: tuple[str, ...] = ("generation_config.json",),
    tokenizers: Sequence[TokenizerSpec] = (),
    model: Any = DECODER,
    lora_targets: tuple[str, ...] | None = None,
) -> Family:
    """The architecture of ``config`` (a :class:`zoo.config.ModelConfig` subclass; its
    ``architecture`` is the name) and the tokenizer of its Hub ``repo``, as a :class:`Family`.

    Args:
        config: the family's config class.
        layout: ``(model_type, "module:KEYMAP")``: the Hugging Face ``config.json``
            ``model_type`` the family reads, and a lazy reference to its
            :class:`~zoo.checkpoint.hf_layout.KeyMap`. The layout is named
            ``"hf-<architecture>"``; zoo imports it only for a checkpoint of that
            ``model_type`` (or when asked for it by name).
        description: one line for ``zoo info``.
        repo, revision: the Hub repo whose tokenizer files (``tokenizer.json``,
            ``tokenizer_config.json`` and ``tokenizer_files``) are the family's tokenizer, at a
            pinned revision; ``None``: no such tokenizer.
        tokenizer: that tokenizer's name (default: the architecture's).
        tokenizer_description: one line for it.
        tokenizer_files: more files of the repo the tokenizer reads (``generation_config.json``
            names the end ids a chat model stops at); ``()`` where the repo has none.
        tokenizers: further tokenizers the family supplies.
        model: the model class (default: the shared decoder), or a lazy reference to it.
        lora_targets: the layers a LoRA adapts by default (``ArchitectureSpec.lora_targets``;
            ``None``: attention's and the feed-forward's projections).
    """
    name = config.architecture  # type: ignore[attr-defined]
    model_type, keymap = layout
    layout_name = f"hf-{name}"
    architecture = ArchitectureSpec(
        name=name,
        config=_reference(config),
        model=model,
        description=description,
        checkpoint_layouts={layout_name: keymap},
        hf_model_types={model_type: layout_name},
        lora_targets=lora_targets,
    )
    declared = list(tokenizers)
    if repo is not None:
        declared.insert(
            0,
            repo_tokenizer_spec(
                tokenizer or name,
                repo,
                revision=revision,
                extra=tokenizer_files,
                description=tokenizer_description,
            ),
        )
    return Family(architecture, tuple(declared))
