"""``adapter_config.json`` as peft writes it, and the checks on one zoo reads.

zoo writes every key peft 0.21 writes, with peft's defaults where zoo has nothing to say. On
reading, the keys zoo honours are read (``r``, ``lora_alpha``, ``lora_dropout``,
``target_modules``, ``rank_pattern``, ``alpha_pattern``, ``use_rslora``; the adapted modules
come from the weights, which also honours ``layers_to_transform``), the keys that change
nothing at inference are ignored, and every other key must hold its default (``null``,
``false``, ``{}``, ``[]``, or ``"none"`` for ``bias``): anything else (DoRA, ``modules_to_save``,
a LoRA bias, activated LoRA, ...) is refused naming the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import CheckpointError
from .lora_config import MAX_ALPHA

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "LoraSettings", "check_config", "peft_config"]

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

#: Keys that change nothing once the weights are trained (initialisation, bookkeeping).
_INERT = frozenset(
    {
        "auto_mapping", "base_model_name_or_path", "revision", "inference_mode",
        "init_lora_weights", "peft_version", "task_type", "fan_in_fan_out",
        "megatron_core", "megatron_config", "qalora_group_size", "loftq_config", "eva_config",
        "corda_config", "lora_ga_config", "exclude_modules", "ensure_weight_tying",
        "layers_to_transform", "layers_pattern",
    }
)  # fmt: skip

#: Keys zoo reads.
_READ = frozenset(
    {"peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "rank_pattern",
     "alpha_pattern", "use_rslora", "bias"}
)  # fmt: skip


def peft_config(
    *,
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: Sequence[str],
    fan_in_fan_out: bool,
    rank_pattern: Mapping[str, int],
    alpha_pattern: Mapping[str, float],
    base: str | None,
    revision: str | None,
    task_type: str = "CAUSAL_LM",
) -> dict[str, Any]:
    """The ``adapter_config.json`` peft 0.21 writes for a LoRA of these values; ``task_type``
    is peft's name of the model's task (``"SEQ_2_SEQ_LM"`` for an encoder-decoder), which
    picks the class ``PeftModel.from_pretrained`` wraps the model in."""

    def number(value: float) -> float | int:
        return int(value) if float(value).is_integer() else value

    return {
        "alora_invocation_tokens": None,
        "alpha_pattern": {k: number(v) for k, v in alpha_pattern.items()},
        "arrow_config": None,
        "auto_mapping": None,
        "base_model_name_or_path": base,
        "bias": "none",
        "corda_config": None,
        "ensure_weight_tying": False,
        "eva_config": None,
        "exclude_modules": None,
        "fan_in_fan_out": fan_in_fan_out,
        "inference_mode": True,
        "init_lora_weights": True,
        "kasa_config": None,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "loftq_config": {},
        "lora_alpha": number(alpha),
        "lora_bias": False,
        "lora_dropout": dropout,
        "lora_ga_config": None,
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "modules_to_save": None,
        "monteclora_config": None,
        "peft_type": "LORA",
        "qalora_group_size": 16,
        "r": rank,
        "rank_pattern": dict(rank_pattern),
        "revision": revision,
        "target_modules": list(target_modules),
        "target_parameters": None,
        "task_type": task_type,
        "trainable_token_indices": None,
        "use_bdlora": None,
        "use_dora": False,
        "use_qalora": False,
        "use_rslora": False,
        "velora_config": None,
    }


def _refuse(where: str, message: str) -> CheckpointError:
    return CheckpointError(f"{where}: {message}", path=where)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class LoraSettings:
    """What zoo reads of a checked ``adapter_config.json``: ``rank``, ``alpha``,
    ``dropout``, ``rslora``, ``target_modules`` (``None`` for peft's regex form) and the
    per-module rank and alpha (:meth:`rank_of`, :meth:`alpha_of`, peft's pattern rules)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.rank: int = config["r"]
        self.alpha: float = float(config["lora_alpha"])
        self.dropout: float = float(config.get("lora_dropout") or 0.0)
        self.rslora: bool = bool(config.get("use_rslora"))
        targets = config.get("target_modules")
        self.target_modules: tuple[str, ...] | None = (
            tuple(targets) if isinstance(targets, list) else None
        )
        self.rank_pattern: dict[str, int] = dict(config.get("rank_pattern") or {})
        self.alpha_pattern: dict[str, float] = dict(config.get("alpha_pattern") or {})

    @staticmethod
    def _pattern(patterns: Mapping[str, Any], module: str) -> str | None:
        """peft's ``get_pattern_key``: the first pattern that ends ``module``."""
        for key in patterns:
            if re.match(rf"(.*\.)?({key})$", module):
                return key
        return None

    def rank_of(self, module: str) -> int:
        """The rank peft gives ``module``."""
        key = self._pattern(self.rank_pattern, module)
        return self.rank if key is None else self.rank_pattern[key]

    def alpha_of(self, module: str) -> float:
        """The alpha peft gives ``module``."""
        key = self._pattern(self.alpha_pattern, module)
        return self.alpha if key is None else float(self.alpha_pattern[key])

    def scaling(self, module: str, rank: int) -> float:
        """peft's scaling of ``module``'s update: alpha / rank (alpha / sqrt(rank) with
        rslora)."""
        return self.alpha_of(module) / (math.sqrt(rank) if self.rslora else rank)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive(value: Any) -> bool:
    return _is_number(value) and value > 0


def _alpha(value: Any) -> bool:
    """A ``lora_alpha``: positive and at most :data:`~zoo.adapters.lora_config.MAX_ALPHA` (a
    larger one overflows float32 on its way to the weights)."""
    return _positive(value) and value <= MAX_ALPHA


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return len(pattern) <= 1000


def _simple(pattern: str) -> bool:
    """A ``rank_pattern`` / ``alpha_pattern`` key zoo matches: a valid pattern without groups
    or counted repeats and with at most three ``*``/``+``/``?`` (module names, ``.``, classes
    such as ``[0-3]``), so that matching it against a module name takes no time whatever the
    file says (a nested repeat, ``(a*)*b``, can take years)."""
    return (
        _compiles(pattern)
        and not set(pattern) & set("(){}")
        and sum(pattern.count(c) for c in "*+?") <= 3
    )


def _names(value: Any) -> bool:
    """peft's ``target_modules``: a list of names, or one regex."""
    if isinstance(value, str):
        return _compiles(value)
    return isinstance(value, list) and all(isinstance(t, str) and t for t in value)


def _patterns(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``rank_pattern`` / ``alpha_pattern``: valid patterns, each to a value ``test`` takes."""
    return lambda value: (
        isinstance(value, dict)
        and all(isinstance(k, str) and _simple(k) and test(v) for k, v in value.items())
    )


#: The keys zoo reads: (key, its default when absent (``...``: required), the test, what it
#: must be).
_VALUES: tuple[tuple[str, Any, Callable[[Any], bool], str], ...] = (
    ("r", ..., _positive_int, "a positive integer"),
    ("lora_alpha", ..., _alpha, "a positive number at most 2**32"),
    ("lora_dropout", 0.0, lambda v: v is None or (_is_number(v) and 0 <= v < 1),
     "a number in [0, 1)"),
    ("use_rslora", False, lambda v: isinstance(v, bool), "true or false"),
    ("target_modules", None, lambda v: v is None or _names(v),
     "a list of module names (or a valid regex)"),
    ("rank_pattern", {}, lambda v: v is None or _patterns(_positive_int)(v),
     "an object of module names (simple patterns) to positive integers"),
    ("alpha_pattern", {}, lambda v: v is None or _patterns(_alpha)(v),
     "an object of module names (simple patterns) to positive numbers at most 2**32"),
)  # fmt: skip


def _check_values(config: Mapping[str, Any], where: str) -> None:
    """The values of the keys zoo reads, each of the right type."""
    for key, default, test, what in _VALUES:
        value = config.get(key, default)
        if value is ... or not test(value):
            got = "nothing" if value is ... else repr(value)[:200]
            raise _refuse(where, f"{key!r} must be {what}, got {got}")


def check_config(config: Any, where: str) -> LoraSettings:
    """The settings of a parsed ``adapter_config.json`` zoo can honour exactly.

    Raises:
        CheckpointError: not a LoRA (``peft_type``), a key zoo cannot honour set (``use_dora``,
            ``modules_to_save``, ``bias``, ``lora_bias``, ``target_parameters``, ...), or a
            value of the wrong type; the message names the key.
    """
    if not isinstance(config, dict):
        raise _refuse(where, f"must hold a JSON object, not {type(config).__name__}")
    kind = config.get("peft_type")
    if kind != "LORA":
        raise _refuse(
            where, f"'peft_type' is {kind!r}; zoo reads LoRA adapters only (peft_type 'LORA')"
        )
    bias = config.get("bias", "none")
    if bias != "none":
        raise _refuse(
            where,
            f"'bias' is {bias!r}: the adapter trains biases, which zoo cannot apply; "
            "zoo reads adapters with bias 'none'",
        )
    for key, value in config.items():
        if key in _INERT or key in _READ:
            continue
        if value not in (None, False, {}, []):
            raise _refuse(
                where,
                f"{key!r} is {value!r}, which zoo cannot honour exactly "
                f"({_WHY.get(key, 'not a plain LoRA')}); zoo reads plain LoRA adapters",
            )
    _check_values(config, where)
    return LoraSettings(config)


#: Why a key is refused, for the message.
_WHY = {
    "use_dora": "DoRA rescales each weight by a learned magnitude",
    "modules_to_save": "it replaces whole layers with trained copies",
    "lora_bias": "the adapter has a bias of its own",
    "target_parameters": "it adapts parameters, not linear layers",
    "trainable_token_indices": "it trains embedding rows",
    "layer_replication": "it repeats layers of the base",
    "use_qalora": "QA-LoRA pools the adapter's input",
    "alora_invocation_tokens": "activated LoRA applies only after its invocation tokens",
}
