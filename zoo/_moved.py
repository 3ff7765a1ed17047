"""Old import paths of modules that moved, kept working for plugins written against them.

``import zoo.specs`` (say) still gives the module, now :mod:`zoo.plugin.specs` (the very same
module object, so ``isinstance`` and monkeypatching agree), with a :class:`DeprecationWarning`
that names the new path. The finder is installed by ``zoo/__init__``, which Python runs before
it looks for any ``zoo.*`` submodule.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "MOVED_NAMES", "REMOVAL", "install", "moved_name"]

#: The first release from which the old paths below no longer import (announced in each
#: warning, so that a plugin's author has one date to plan for).
REMOVAL = "zoo 0.3"

#: Old module name -> where it lives now.
MOVED = {
    "zoo.hookspecs": "zoo.plugin.hookspecs",
    "zoo.specs": "zoo.plugin.specs",
    "zoo.components": "zoo.plugin.components",
    "zoo.plugins": "zoo.plugin.host",
    "zoo.registry": "zoo.plugin.current",
    "zoo.plugin.claims": "zoo.plugin.registry",
    "zoo.convert": "zoo.checkpoint.hf_layout",
    "zoo.hf_config": "zoo.checkpoint.hf_config",
    "zoo.tokenizers.repo": "zoo.plugin.tokenizer_specs",
    "zoo.tokenizers.hub": "zoo.hub.tokenizer_files",
    # zoo.nn kept the model code; kernels, quantization, LoRA and serving state moved out
    "zoo.nn.native": "zoo.kernels.native",
    "zoo.nn.native_abi": "zoo.kernels.native_abi",
    "zoo.nn.native_facts": "zoo.kernels.native_facts",
    "zoo.nn.native_int8": "zoo.kernels.native_int8",
    "zoo.nn.threads": "zoo.kernels.threads",
    "zoo.nn.quant": "zoo.quant.layers",
    "zoo.nn.quant_grad": "zoo.quant.grad",
    "zoo.nn.lora": "zoo.adapters.lora",
    "zoo.nn.lora_bank": "zoo.adapters.lora_bank",
    "zoo.nn.lora_check": "zoo.adapters.lora_check",
    "zoo.nn.lora_config": "zoo.adapters.lora_config",
    "zoo.nn.slots": "zoo.runtime.slots",
    "zoo.nn.slot_step": "zoo.runtime.slot_step",
    "zoo.nn.prefix_cache": "zoo.runtime.prefix_cache",
    "zoo.serve.budget": "zoo.serve.prefill_budget",
    "zoo.serve.chat": "zoo.serve.chat_prompt",
    "zoo.train.budget": "zoo.train.time_budget",
    "zoo.train.chat": "zoo.train.chat_data",
    "zoo.train.files": "zoo.train.data_files",
    "zoo.tokenizers.files": "zoo.tokenizers.vocab_files",
    "zoo.hub.load": "zoo.hub.snapshot",
    # decoding state went to zoo.runtime; oneDNN's kernel to zoo.kernels (its layer: zoo.nn.linear)
    "zoo.nn.cache": "zoo.runtime.cache",
    "zoo.nn.session": "zoo.runtime.session",
    "zoo.nn.decoding": "zoo.runtime.decoding",
    "zoo.nn.native_block": "zoo.runtime.native_block",
    "zoo.nn.native_plan": "zoo.runtime.native_plan",
    "zoo.nn.onednn": "zoo.kernels.onednn",
}

#: Names a package exported that now come from elsewhere: ``package.name`` -> ``module:name``
#: (read by the package's module ``__getattr__`` through :func:`moved_name`).
MOVED_NAMES = {
    f"zoo.nn.{name}": f"zoo.runtime.{module}:{name}"
    for module, names in {
        "cache": ("KVCache", "LayerCache"),
        "decoding": ("DecoderSession", "StaticDecoderSession", "start_session"),
        "session": ("DecodingSession", "RecomputeSession"),
    }.items()
    for name in names
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there ({REMOVAL} removes the old path)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already run."""


def moved_name(package: str, name: str) -> object:
    """``package.name`` from where :data:`MOVED_NAMES` says it lives now, with a
    :class:`DeprecationWarning` that names the new place; an ``AttributeError`` for a name the
    package never had (a package's module ``__getattr__`` returns this)."""
    ref = MOVED_NAMES.get(f"{package}.{name}")
    if ref is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module, _, attribute = ref.partition(":")
    warnings.warn(
        f"{package}.{name} moved to {module}.{attribute}; import it from there "
        f"({REMOVAL} removes the old name)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), attribute)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
