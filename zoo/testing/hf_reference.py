"""What both reference comparisons of the kit share (:mod:`zoo.testing.reference` for
decoders, :mod:`zoo.testing.reference_encdec` for encoder-decoders): the tolerance, the
skip, a tokenizer over bare ids, and the ``transformers`` class a Hugging Face folder's
``config.json`` names, loaded as the reference."""

from __future__ import annotations

import importlib
import inspect
import re
import unittest
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import jsonfile

__all__ = [
    "REFERENCE_ATOL",
    "CheckSkipped",
    "IdsTokenizer",
    "TransformersReference",
    "install_line",
    "transformers_reference",
]

#: Largest absolute logit difference the reference check accepts (float32).
REFERENCE_ATOL = 1e-4


class IdsTokenizer:
    """A tokenizer over ids alone (id ``i`` is the word ``"i"``), so that streaming can be
    compared with plain generation on any model, whatever its own tokenizer needs."""

    name = "ids"
    eos_id = None
    bos_id = None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [int(word) for word in text.split()]

    def decode(self, ids: list[int]) -> str:
        return "".join(f" {i}" for i in ids)


class CheckSkipped(unittest.SkipTest):
    """A check that cannot run, and why (``str(exc)``).

    It derives from :class:`unittest.SkipTest`, so a check run inside a pytest test
    (:func:`zoo.testing.run_check`) skips that test with the reason instead of failing it;
    :func:`zoo.testing.run_conformance` and ``zoo check`` report it as ``skipped``."""


# -- transformers as the reference ----------------------------------------------------------
class TransformersReference:
    """A transformers model as a :class:`~zoo.testing.reference.Reference` (positions from
    the mask, passed explicitly where the model takes them, as ``generate`` does)."""

    def __init__(self, model: Any, loading_info: dict[str, Any] | None = None) -> None:
        self.model = model
        #: what ``from_pretrained`` reported (missing or unexpected keys), named on a failure.
        self.loading_info = loading_info or {}
        self.takes_positions = "position_ids" in inspect.signature(model.forward).parameters

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        kwargs: dict[str, Tensor] = {"attention_mask": attention_mask}
        if self.takes_positions:
            kwargs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            return self.model(input_ids, **kwargs).logits

    def generate(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> Tensor:
        settings = self.model.generation_config
        settings.eos_token_id = None  # never stop early: zoo is asked for every token too
        settings.pad_token_id = 0
        with torch.no_grad():
            out = self.model.generate(
                input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
            )
        return out[:, input_ids.shape[1] :]


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise CheckSkipped(
            f"transformers is not installed ({exc}): {install_line('transformers')} adds it"
        ) from None


#: The extras of torch-zoo to name for a missing package, in order of preference (the
#: smallest that brings it first).
_EXTRAS = ("check", "test")


def install_line(package: str) -> str:
    """The command that installs ``package`` with zoo: ``pip install 'torch-zoo[EXTRA]'``
    for the first of :data:`_EXTRAS` that lists it in the installed metadata, else ``pip
    install PACKAGE``."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        listed = requires("torch-zoo") or []
    except PackageNotFoundError:  # run from a source tree that was never installed
        listed = []
    named = re.compile(rf"{re.escape(package)}(?![\w.-])")
    for extra in _EXTRAS:
        for requirement in listed:
            name, _, marker = requirement.partition(";")
            if f'extra == "{extra}"' in marker and named.match(name.strip()):
                return f"pip install 'torch-zoo[{extra}]'"
    return f"pip install {package}"


def transformers_reference(folder: Path) -> TransformersReference:
    """The :class:`~zoo.testing.reference.Reference` of a Hugging Face folder: the
    ``transformers`` class its ``config.json`` names in ``architectures``, in float32 with
    eager attention.

    Raises:
        CheckSkipped: transformers is not installed, or has no class of that name.
    """
    transformers = _transformers()
    config = jsonfile.read(Path(folder) / "config.json")
    names = config.get("architectures") or []
    if not names:
        raise CheckSkipped(f"{folder}/config.json names no architecture class")
    cls = getattr(transformers, names[0], None)
    if cls is None:
        raise CheckSkipped(
            f"transformers {transformers.__version__} has no class {names[0]!r} (the "
            "exported config.json's architecture)"
        )
    logging = transformers.utils.logging
    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # "Loading weights" on every check
    load = {"dtype": torch.float32, "attn_implementation": "eager", "output_loading_info": True}
    try:
        model, info = cls.from_pretrained(str(folder), **load)
    except (RuntimeError, ValueError) as exc:  # a tensor of another shape, a refused config
        _refuse_mismatched_shapes(cls, folder, names[0], load)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AssertionError(f"{names[0]} cannot load the exported checkpoint: {first}") from None
    finally:
        if bar:
            logging.enable_progress_bar()
    reported = {k: v for k, v in info.items() if v}
    _refuse_key_mismatch(names[0], reported)
    return TransformersReference(model.eval(), reported)


#: What ``from_pretrained(..., output_loading_info=True)`` reports of a checkpoint's keys.
_KEY_REPORTS = {
    "missing_keys": "missing (transformers initialised them itself: zeros or random values, "
    "so a weight the layout never writes can pass a logits comparison)",
    "unexpected_keys": "unexpected (written by zoo, read by nothing)",
    "mismatched_keys": "of another shape than the class expects",
}


def _refuse_mismatched_shapes(cls: Any, folder: Path, name: str, load: dict[str, Any]) -> None:
    """Where transformers refused the checkpoint, the keys of another shape than ``cls``
    expects, named (its error only points at a table it printed), from a second load that
    lets them through; nothing where that load fails too."""
    try:
        _, info = cls.from_pretrained(str(folder), ignore_mismatched_sizes=True, **load)
    except (RuntimeError, ValueError):
        return
    _refuse_key_mismatch(name, {k: v for k, v in info.items() if v})


def _refuse_key_mismatch(cls_name: str, reported: dict[str, Any]) -> None:
    """An ``AssertionError`` naming every key ``cls_name`` found missing, unexpected or
    mis-shaped in the exported checkpoint: the layout and the reference disagree on what the
    model holds, whatever the logits say."""
    problems = [
        f"{what}: {sorted(map(_shown_key, reported[key]))[:8]}"
        + (f" and {len(reported[key]) - 8} more" if len(reported[key]) > 8 else "")
        for key, what in _KEY_REPORTS.items()
        if reported.get(key)
    ]
    if problems:
        raise AssertionError(
            f"{cls_name} loaded the exported checkpoint with keys " + "; keys ".join(problems)
        )


def _shown_key(entry: Any) -> str:
    """A reported key: its name, and for one of another shape ``(key, in the file,
    expected)`` both shapes."""
    if isinstance(entry, tuple) and len(entry) == 3:
        key, found, expected = entry
        return f"{key} {tuple(found)} in the file, {tuple(expected)} expected"
    return str(entry)
