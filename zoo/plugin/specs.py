"""Frozen spec objects that plugins return from their hooks.

Specs are plain data and cheap to create: classes are named by lazy ``"module:attribute"``
references (or given directly), so a plugin's hook module need not import torch. This keeps
``zoo list`` fast however many plugins are installed.
"""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._lazy import resolve
from ..errors import PluginContractError, PluginError
from .model_specs import AdapterSpec, ModelSpec, WeightsSource, check_name, frozen_mapping

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

#: Where a plugin author reads what an architecture must provide.
_CONTRACT = (
    "Subclass it (docs/plugins.md, 'What a model must provide', lists what a model needs; "
    "wrap an existing nn.Module inside a ZooModel subclass)."
)

__all__ = [
    "COMPONENT_KINDS",
    "AdapterSpec",
    "ArchitectureSpec",
    "ComponentSpec",
    "ModelSpec",
    "TokenizerFactory",
    "TokenizerSpec",
    "WeightsSource",
]

#: What a :class:`TokenizerSpec`'s factory is: called with keyword arguments only (none from
#: :func:`zoo.load`, ``directory=`` when the spec ``reads_checkpoint``, the caller's from
#: :func:`zoo.tokenizer`), it returns a :class:`zoo.tokenizers.Tokenizer` or raises a
#: :class:`zoo.tokenizers.TokenizerError` saying why it cannot.
TokenizerFactory = Callable[..., "Tokenizer"]

#: What zoo uses of a tokenizer: a factory's result must have each.
_TOKENIZER_ATTRIBUTES = ("name", "vocab_size", "eos_id", "bos_id", "encode", "decode")


def describe_exception(exc: BaseException) -> str:
    """``"Type: message (at file:line)"``, where ``file:line`` is where it was raised."""
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


@dataclasses.dataclass(frozen=True)
class ArchitectureSpec:
    """An architecture supplied by a plugin.

    Args:
        name: registry name, e.g. ``"gpt2"``.
        config: the config class (a :class:`zoo.config.ModelConfig` subclass) or a lazy
            ``"module:Class"`` reference to it.
        model: the :class:`zoo.nn.ZooModel` class, or a lazy reference to it. It is called as
            ``model(config, parts)`` when its constructor takes a ``parts`` parameter (the
            :class:`zoo.nn.Parts` the registry resolved from the config: plugins'
            components), else as ``model(config)``.
        description: one line for ``zoo info``.
        blocks: names of the blocks the model is made of, for ``zoo info``.
        checkpoint_layouts: foreign checkpoint layouts this architecture converts from and to,
            by layout name (e.g. ``"hf-gpt2"``) -> a
            :class:`zoo.checkpoint.hf_layout.KeyMap` or lazy reference.
        reference: the implementation the conformance kit's ``reference`` check compares the
            model with, instead of the ``transformers`` class of its Hugging Face layout (for a
            family transformers lacks): a :data:`zoo.testing.reference.ReferenceFactory`, or a
            lazy ``"module:callable"`` reference to one. Called with the folder the kit wrote
            the random-weight model to (:func:`zoo.export`'s when a Hugging Face layout holds
            it, else :func:`zoo.save`'s), it returns ``(input_ids, attention_mask) -> logits``.
        hf_model_types: the Hugging Face ``config.json`` ``model_type`` each of its
            ``checkpoint_layouts`` reads (``{"gpt2": "hf-gpt2"}``), declared so that loading a
            Hugging Face folder imports only the layout of its ``model_type``. A layout left
            out here is imported to ask it (``KeyMap.model_type``) when any folder is read.
        lora_targets: the layers a LoRA adapts when it names none (:class:`zoo.LoRA`'s
            ``targets``), as zoo module names (``"attn.qkv"``); ``None``: every projection of
            attention and of the feed-forward (:data:`zoo.adapters.lora.DEFAULT_TARGETS`). A family
            whose feed-forward is not made of linear layers (Mixtral's stacked experts) names
            attention's only.
    """

    name: str
    config: Any
    model: Any
    description: str = ""
    blocks: tuple[str, ...] = ()
    checkpoint_layouts: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reference: Any = None
    hf_model_types: Mapping[str, str] = dataclasses.field(default_factory=dict)
    lora_targets: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_name("architecture", self.name)
        if self.lora_targets is not None:
            targets = self.lora_targets
            if (
                isinstance(targets, str)
                or not targets
                or not all(isinstance(t, str) and t for t in targets)
            ):
                raise ValueError(
                    f"architecture {self.name!r}: lora_targets must be a non-empty sequence "
                    f"of module names such as ('attn.qkv', 'attn.proj'), got {targets!r}"
                )
            object.__setattr__(self, "lora_targets", tuple(targets))
        object.__setattr__(self, "blocks", tuple(self.blocks))
        object.__setattr__(self, "checkpoint_layouts", frozen_mapping(self.checkpoint_layouts))
        object.__setattr__(self, "hf_model_types", frozen_mapping(self.hf_model_types))
        undeclared = sorted(set(self.hf_model_types.values()) - set(self.checkpoint_layouts))
        if undeclared:
            raise ValueError(
                f"architecture {self.name!r}: hf_model_types names layouts it does not "
                f"declare in checkpoint_layouts: {', '.join(undeclared)}"
            )

    @property
    def config_class(self) -> Any:
        """The config class (imported on first use); it must derive from
        :class:`zoo.config.ModelConfig`."""
        from ..config import ModelConfig

        cls = self._resolve("config", self.config)
        if not (isinstance(cls, type) and issubclass(cls, ModelConfig)):
            raise PluginContractError(
                f"architecture {self.name!r}: its config {cls!r} is not a subclass of "
                f"zoo.config.ModelConfig. {_CONTRACT}"
            )
        return cls

    @property
    def model_class(self) -> Any:
        """The model class (imported on first use); it must derive from
        :class:`zoo.nn.ZooModel`."""
        from torch import nn

        from ..nn.base import ZooModel

        cls = self._resolve("model", self.model)
        if not (isinstance(cls, type) and issubclass(cls, ZooModel)):
            raise PluginContractError(
                f"architecture {self.name!r}: its model {cls!r} is not a subclass of "
                "zoo.nn.ZooModel, so zoo cannot rely on config, name, example_inputs(), "
                f"start_decoding() or the loading conventions. {_CONTRACT}"
            )
        missing = [
            f"{method}()"
            for method, base in (("forward", nn.Module), ("example_inputs", ZooModel))
            if getattr(cls, method) is getattr(base, method)
        ]
        if missing:
            raise PluginContractError(
                f"architecture {self.name!r}: its model {cls.__name__} lacks "
                f"{', '.join(missing)}, which every zoo model provides. {_CONTRACT}"
            )
        return cls

    @property
    def reference_factory(self) -> Any:
        """The :attr:`reference` callable (imported on first use), or ``None``."""
        if self.reference is None:
            return None
        factory = self._resolve("reference", self.reference)
        if not callable(factory):
            raise PluginContractError(
                f"architecture {self.name!r}: its reference {self.reference!r} is not callable "
                "(it must be folder -> (input_ids, attention_mask) -> logits)"
            )
        return factory

    def build(self, config: Any, parts: Any) -> Any:
        """``model_class(config, parts)``, or ``model_class(config)`` for a model class that
        takes no parts."""
        cls = self.model_class
        if "parts" in inspect.signature(cls.__init__).parameters:
            return cls(config, parts=parts)
        return cls(config)

    def _resolve(self, what: str, ref: Any) -> Any:
        """Import the lazy reference ``ref``; whatever its module raises (an ImportError, a
        bug at import time, ``SystemExit``) becomes a :class:`~zoo.errors.PluginError` naming
        this architecture, so one broken plugin is one clear error, never a traceback."""
        try:
            return resolve(ref)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise PluginError(
                f"architecture {self.name!r}: importing its {what} class {ref!r} failed: "
                f"{describe_exception(exc)}. Fix or uninstall the plugin that supplies it; "
                "`zoo plugins` lists every plugin that failed"
            ) from exc

    def declared_model_type(self, layout: str) -> str | None:
        """The Hugging Face ``model_type`` :attr:`hf_model_types` declares ``layout`` reads
        (``None``: not declared; importing the layout says)."""
        return next((t for t, name in self.hf_model_types.items() if name == layout), None)

    def checkpoint_layout(self, layout: str) -> Any:
        """The key map for ``layout``, or a ``KeyError`` listing the layouts supported; a
        :class:`~zoo.errors.PluginContractError` when it reads another ``model_type`` than
        :attr:`hf_model_types` declares (a folder was matched to it by that declaration)."""
        if layout not in self.checkpoint_layouts:
            known = ", ".join(sorted(self.checkpoint_layouts)) or "none"
            raise KeyError(
                f"architecture {self.name!r} has no checkpoint layout {layout!r} (it has: {known})"
            )
        keymap = resolve(self.checkpoint_layouts[layout])
        declared = self.declared_model_type(layout)
        read = getattr(keymap, "model_type", None)
        if declared is not None and read != declared:
            raise PluginContractError(
                f"architecture {self.name!r}: hf_model_types declares that layout {layout!r} "
                f"reads model_type {declared!r}, but the layout reads {read!r}; make the two "
                "agree in the plugin"
            )
        return keymap


def _file_sets(files: Any) -> Any:
    """``checkpoint_files`` as its sets of files: itself when it holds sets, else one set."""
    return files if files and isinstance(files[0], tuple) else (files,)


def _plain_file_names(group: Any) -> bool:
    """Whether ``group`` is a tuple of plain file names (no folders, no ``.`` or ``..``)."""
    return isinstance(group, tuple) and all(
        isinstance(f, str) and f and "/" not in f and "\\" not in f and f not in (".", "..")
        for f in group
    )


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """A tokenizer a plugin supplies.

    The factory contract: ``factory(**kwargs)`` returns a :class:`zoo.tokenizers.Tokenizer`
    or raises a :class:`zoo.tokenizers.TokenizerError` saying why it cannot (never returns
    ``None``). ``zoo.tokenizer(name, **kwargs)`` passes the caller's keywords through. When
    ``reads_checkpoint`` is true the factory also accepts ``directory=``, a checkpoint
    directory holding the tokenizer's files, and :func:`zoo.load` passes it; otherwise
    :func:`zoo.load` calls ``factory()`` with no arguments, whatever the factory's parameters
    are called.

    Args:
        name: registry name, e.g. ``"gpt2-bpe"``.
        factory: a :data:`TokenizerFactory` (or a lazy ``"module:function"`` reference to one).
        description: one line for ``zoo info``.
        reads_checkpoint: the factory reads its files from ``directory=`` (a checkpoint
            directory) when given one, as ``gpt1``'s (``vocab.json`` + ``merges.txt`` of a
            Hugging Face directory) and ``transformer-encdec``'s (a trained tokenizer) do.
        checkpoint_files: the files of this tokenizer in a Hugging Face checkpoint directory
            (``("vocab.json", "merges.txt")``), or several such sets, any of which will do
            (``(("vocab.json", "merges.txt"), ("tokenizer.json",))``). A checkpoint that
            names no model gets a tokenizer only from its own files: this one when its
            architecture's named model declares it and every file of a set is in the
            directory (never downloaded, never chosen because a vocabulary size happens to
            match); the factory then checks the files it is given, and where it refuses
            them, the directory's own ``tokenizer.json`` is used as written.
    """

    name: str
    factory: TokenizerFactory | str
    description: str = ""
    reads_checkpoint: bool = False
    checkpoint_files: tuple[str, ...] | tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        check_name("tokenizer", self.name)
        if not isinstance(self.reads_checkpoint, bool):
            raise ValueError(f"tokenizer {self.name!r}: reads_checkpoint must be True or False")
        files = self.checkpoint_files
        if not isinstance(files, tuple) or not all(
            _plain_file_names(group) and (group or not files) for group in _file_sets(files)
        ):
            raise ValueError(
                f"tokenizer {self.name!r}: checkpoint_files must be a tuple of plain file names "
                "(or a tuple of such tuples: alternative sets)"
            )
        if files and not self.reads_checkpoint:
            raise ValueError(
                f"tokenizer {self.name!r}: checkpoint_files needs reads_checkpoint=True"
            )

    @property
    def checkpoint_file_sets(self) -> tuple[tuple[str, ...], ...]:
        """The sets of :attr:`checkpoint_files`, any of which is this tokenizer's files in a
        checkpoint directory (none when it declares none)."""
        return _file_sets(self.checkpoint_files) if self.checkpoint_files else ()

    def load(self, **kwargs: Any) -> Tokenizer:
        """Create the tokenizer (imports its implementation on first use).

        Raises:
            zoo.tokenizers.TokenizerError: the factory cannot create it, does not take the
                keywords given, or broke its contract (returned ``None`` or an object that is
                not a tokenizer).
        """
        from ..tokenizers.errors import TokenizerError

        factory = resolve(self.factory)
        self._check_keywords(factory, kwargs)
        tokenizer = factory(**kwargs)
        if tokenizer is None:
            raise TokenizerError(
                f"the factory of tokenizer {self.name!r} returned None; a factory must return "
                "a zoo.tokenizers.Tokenizer or raise a TokenizerError saying why it cannot"
            )
        missing = [a for a in _TOKENIZER_ATTRIBUTES if not hasattr(tokenizer, a)]
        if missing:
            kind = type(tokenizer)
            raise TokenizerError(
                f"the factory of tokenizer {self.name!r} returned a {kind.__module__}."
                f"{kind.__qualname__}, which lacks {', '.join(missing)}; a factory must return "
                "a zoo.tokenizers.Tokenizer: wrap a tokenizers.Tokenizer in "
                "zoo.tokenizers.HFTokenizer, a tiktoken encoding in "
                "zoo.tokenizers.TiktokenTokenizer"
            )
        return tokenizer

    def _check_keywords(self, factory: Any, kwargs: Mapping[str, Any]) -> None:
        """Refuse keywords the factory does not take, naming the ones it does (a factory
        called with ``directory=`` it cannot read must not fail with a bare TypeError)."""
        from ..tokenizers.errors import TokenizerError

        try:
            signature = inspect.signature(factory)
        except (TypeError, ValueError):  # a builtin or C callable: let the call say
            return
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            takes = ", ".join(f"{p}=" for p in signature.parameters) or "none"
            given = ", ".join(f"{k}=" for k in kwargs) or "no arguments"
            hint = (
                "; its spec says reads_checkpoint=True, so zoo.load passes directory=: add a "
                "`directory: pathlib.Path | None = None` parameter, or drop reads_checkpoint"
                if self.reads_checkpoint and "directory" in kwargs
                else ""
            )
            raise TokenizerError(
                f"the factory of tokenizer {self.name!r} cannot be called with {given}: {exc} "
                f"(its parameters: {takes}){hint}"
            ) from None


#: The kinds of component a Transformer is composed of; each is also the config field that
#: names the component (``positions = "rotary"``, ``norm = "rmsnorm"``, ``ffn = "swiglu"``,
#: ``attention = "mha"``, ``block = "sandwich"``, and ``cross_attention = "mha"`` in an
#: encoder-decoder's config).
COMPONENT_KINDS = (
    "positions", "norm", "ffn", "attention", "cross_attention", "block", "embedding", "head",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ComponentSpec:
    """A building block a plugin supplies, by kind and name: the shared decoder
    (:class:`zoo.nn.DecoderLM`) builds the one its config names.

    The factory contract: ``factory(config)`` (the model's whole config, so a component reads
    the fields it needs, its plugin's own included) returns an ``nn.Module``:

    - ``positions``: a :class:`zoo.nn.PositionScheme` (token-embedding vectors, a rotation of
      queries and keys, and/or an additive attention-score bias);
    - ``norm``: a module ``(*, d_model) -> (*, d_model)``;
    - ``ffn``: a module ``(*, d_model) -> (*, d_model)``, its output projection named ``proj``;
    - ``attention``: a self-attention module with :class:`zoo.nn.MultiHeadAttention`'s
      ``forward`` and an output projection named ``proj``;
    - ``block``: one layer of the shared decoder. Its factory is called as
      ``factory(config, parts, layer)`` (``parts``: a :class:`zoo.nn.Parts` to build the
      block's components from; ``layer``: its index) and returns a module with
      :class:`zoo.nn.TransformerBlock`'s ``forward`` and ``attn``/``ffn`` attributes;
    - ``embedding``: a module ``(B, T, d_model) -> (B, T, d_model)`` between the embedding
      (tokens, scale, multiplier, positions, norm) and the first block, held as
      ``post_embedding`` (a config's ``embedding`` field names it);
    - ``head``: a module on the logits ``(B, T, vocab) -> (B, T, vocab)``, after
      ``logit_scale`` and ``final_softcap``, held as ``post_head`` (``head`` field).

    Args:
        kind: one of :data:`COMPONENT_KINDS`.
        name: registry name within its kind, e.g. ``"rotary"``.
        factory: the factory, or a lazy ``"module:function"`` reference to it.
        description: one line for ``zoo info`` and ``zoo plugins``.
        reads: the config fields that are this component's options (read by components of
            its kind, not by the model itself): ``("activation",)`` for ``mlp``, ``()`` for
            ``swiglu``. A field some component of a kind reads is inert in a config whose
            component of that kind declares it does not, and ``zoo info`` hides it. ``None``
            (the default): not declared, so every field may take effect.
    """

    kind: str
    name: str
    factory: Callable[..., Any] | str
    description: str = ""
    reads: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in COMPONENT_KINDS:
            raise ValueError(
                f"component kind {self.kind!r} is not one of {', '.join(COMPONENT_KINDS)}"
            )
        if self.reads is not None and not (
            isinstance(self.reads, tuple) and all(isinstance(f, str) for f in self.reads)
        ):
            raise ValueError(
                f"{self.kind} component {self.name!r}: reads must be a tuple of config field "
                f"names or None, got {self.reads!r}"
            )
        check_name(f"{self.kind} component", self.name)

    def build(self, config: Any, *args: Any) -> Any:
        """The component for ``config`` (imports its implementation on first use); a block
        also takes ``parts`` and ``layer``."""
        from torch import nn

        module = resolve(self.factory)(config, *args)
        if not isinstance(module, nn.Module):
            raise PluginContractError(
                f"{self.kind} component {self.name!r}: its factory returned "
                f"{type(module).__name__}, not a torch.nn.Module"
            )
        return module
