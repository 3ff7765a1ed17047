"""What llama.cpp writes for each family zoo reads and writes as GGUF, declared as data.

zoo goes between GGUF and its own layout through the family's Hugging Face layout (the
``KeyMap`` its plugin declares): a GGUF file is read as the Hugging Face config and state it
was converted from, and written from them, so every config check and key rule a family has
applies to GGUF too. What this module holds is the difference, per ``general.architecture``:

- ``keys``: each ``{arch}.KEY`` of the metadata and the ``config.json`` key it is;
- the tensor transforms llama.cpp's converter applies: the rotary rows of q and k permuted
  (``permute_qk``, llama's), norm weights stored as ``1 + w`` (``norm_shift``, Gemma's),
  Conv1D weights stored transposed (``conv1d``, GPT-2's), GPT-NeoX's per-head q/k/v rows
  regrouped as q, k, v (``qkv_per_head``), the experts of a mixture stacked in one tensor.

Tensor names are the ``gguf`` package's own map (``gguf.get_tensor_name_map``), the one
llama.cpp's converter uses.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["FAMILIES", "Family", "family_for_model_type", "family_of"]

#: ``{arch}.KEY`` -> ``config.json`` key, shared by the Llama-like families.
_COMMON = (
    ("context_length", "max_position_embeddings"),
    ("embedding_length", "hidden_size"),
    ("block_count", "num_hidden_layers"),
    ("feed_forward_length", "intermediate_size"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
    ("rope.freq_base", "rope_theta"),
    ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ("vocab_size", "vocab_size"),
)


#: The ``config.json`` keys of a stack's depth, among the families.
_BLOCK_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")


@dataclasses.dataclass(frozen=True)
class Family:
    """One GGUF architecture.

    Attributes:
        arch: its ``general.architecture`` (``"llama"``).
        model_type: the Hugging Face ``model_type`` whose zoo layout reads it.
        keys: ``(GGUF key without the arch prefix, config.json key)`` pairs, both ways.
        derived: the keys computed rather than copied: ``(GGUF key, read, write)``, where
            ``read(value, hf)`` sets what the value means in the Hugging Face config and
            ``write(hf)`` gives the value (``None``: not written).
        permute_qk: q and k rows in llama.cpp's rotary order (its ``LlamaModel.permute``).
        norm_shift: added to every norm weight on writing (Gemma stores ``1 + w``).
        conv1d: the Hugging Face weights named here are ``Conv1D`` ``(in, out)``; GGUF
            stores ``(out, in)``.
        qkv_per_head: the fused q/k/v rows are per head in Hugging Face (GPT-NeoX) and
            q, k, v in GGUF.
        tied_head_copy: llama.cpp writes the tied head as its own ``output.weight`` (GPT-2).
        choose_model_type: the ``model_type`` by the metadata where one GGUF architecture
            stands for several (llama with experts is Mixtral).
        swa_period: llama.cpp's fixed pattern of sliding-window layers: in each run of this
            many layers, all but the last slide (Gemma 2: 2, Gemma 3: 6); 0 for none.
        held: ``config.json`` keys and the only values llama.cpp's architecture computes
            with, both ways: T5's 128 relative distances; ``llama``'s lack of a sliding
            window (a Mistral with one is refused).
        tensor_facts: ``config.json`` values that the file's tensor names say (T5's gated
            feed-forward: its ``ffn_gate`` tensors).
    """

    arch: str
    model_type: str
    keys: tuple[tuple[str, str], ...]
    derived: tuple[tuple[str, Callable[..., None], Callable[..., Any]], ...] = ()
    permute_qk: bool = False
    norm_shift: float = 0.0
    conv1d: tuple[str, ...] = ()
    qkv_per_head: bool = False
    tied_head_copy: bool = False
    choose_model_type: Callable[[Mapping[str, Any]], str] | None = None
    swa_period: int = 0
    held: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    tensor_facts: Callable[[set[str]], dict[str, Any]] | None = None

    def layer_types(self, n_layers: int) -> list[str]:
        """``config.json``'s ``layer_types`` of llama.cpp's fixed pattern."""
        return [
            "full_attention" if (i + 1) % self.swa_period == 0 else "sliding_attention"
            for i in range(n_layers)
        ]

    def names(self, hf: Mapping[str, Any]) -> Any:
        """The ``gguf`` package's tensor-name map of this architecture, for the blocks the
        config has (an encoder-decoder: the deeper stack's)."""
        import gguf

        (arch,) = [a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == self.arch]
        counts = [hf.get(key) for key in _BLOCK_COUNTS]
        return gguf.get_tensor_name_map(arch, max(int(n) for n in counts if n is not None))

    def check_held(self, hf: Mapping[str, Any]) -> None:
        """A ``ValueError`` naming each ``config.json`` value the architecture cannot hold."""
        for key, values in self.held.items():
            if hf.get(key, values[0]) not in values:
                held = " or ".join("none" if v is None else repr(v) for v in values)
                raise ValueError(f"{key} is {hf[key]!r}: llama.cpp's {self.arch!r} holds {held}")

    def gguf_name(self, table: Any, key: str) -> tuple[str, int | None]:
        """The GGUF tensor holding the Hugging Face ``key`` in ``table`` (:meth:`names`), and
        the expert index where it is one expert of a mixture's stacked tensor; a
        ``CheckpointError`` where llama.cpp's map has no name for it."""
        from ...errors import CheckpointError

        expert = re.search(r"\.experts\.(\d+)\.", key)
        merged = key if expert is None else key.replace(expert.group(0), ".experts.", 1)
        name = table.get_name(merged, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise CheckpointError(f"{key}: no GGUF name for it in llama.cpp's {self.arch} map")
        return name, None if expert is None else int(expert[1])

    def model_type_of(self, metadata: Mapping[str, Any]) -> str:
        return (
            self.model_type if self.choose_model_type is None else self.choose_model_type(metadata)
        )

    # -- tensors, GGUF -> Hugging Face (in GGUF names) and back --------------------------
    def tensor_from_gguf(self, name: str, tensor: Tensor, hf: Mapping[str, Any]) -> Tensor:
        """A GGUF tensor as its Hugging Face counterpart holds it."""
        if self.norm_shift and name.endswith("norm.weight"):
            tensor = tensor - self.norm_shift
        if self.permute_qk and re.search(r"\.attn_[qk]\.(weight|bias)$", name):
            tensor = _rotary_rows(tensor, _heads_of(name, hf), to_gguf=False)
        if self.qkv_per_head and name.endswith((".attn_qkv.weight", ".attn_qkv.bias")):
            tensor = _qkv_rows(tensor, int(hf["num_attention_heads"]), to_gguf=False)
        if name.endswith(self.conv1d):
            tensor = tensor.t()
        return tensor

    def tensor_to_gguf(self, name: str, tensor: Tensor, hf: Mapping[str, Any]) -> Tensor:
        """A Hugging Face tensor, already named as in GGUF, as llama.cpp stores it."""
        if name.endswith(self.conv1d):
            tensor = tensor.t()
        if self.qkv_per_head and name.endswith((".attn_qkv.weight", ".attn_qkv.bias")):
            tensor = _qkv_rows(tensor, int(hf["num_attention_heads"]), to_gguf=True)
        if self.permute_qk and re.search(r"\.attn_[qk]\.(weight|bias)$", name):
            tensor = _rotary_rows(tensor, _heads_of(name, hf), to_gguf=True)
        if self.norm_shift and name.endswith("norm.weight"):
            tensor = tensor + self.norm_shift
        return tensor


def _heads_of(name: str, hf: Mapping[str, Any]) -> int:
    heads = int(hf["num_attention_heads"])
    kv = hf.get("num_key_value_heads")
    return int(kv) if ".attn_k." in name and kv else heads


def _rotary_rows(tensor: Tensor, heads: int, *, to_gguf: bool) -> Tensor:
    """llama.cpp's ``permute``: each head's rotary pairs from rotate-half order (first half,
    second half) to interleaved (0, half, 1, half + 1, ...), and its inverse."""
    rows = tensor.shape[0]
    rest = tuple(tensor.shape[1:])
    if to_gguf:  # (H, 2, D/2, ...) -> (H, D/2, 2, ...)
        return (
            tensor.reshape(heads, 2, rows // heads // 2, *rest)
            .transpose(1, 2)
            .reshape(tensor.shape)
        )
    # (H, D/2, 2, ...) -> (H, 2, D/2, ...)
    return tensor.reshape(heads, rows // heads // 2, 2, *rest).transpose(1, 2).reshape(tensor.shape)


def _qkv_rows(tensor: Tensor, heads: int, *, to_gguf: bool) -> Tensor:
    """GPT-NeoX's fused rows: per head (H, 3, D) in Hugging Face, (3, H, D) in GGUF."""
    rest = tuple(tensor.shape[1:])
    d = tensor.shape[0] // heads // 3
    if to_gguf:
        return tensor.reshape(heads, 3, d, *rest).transpose(0, 1).reshape(tensor.shape)
    return tensor.reshape(3, heads, d, *rest).transpose(0, 1).reshape(tensor.shape)


# -- derived keys: (GGUF key, read(value, hf), write(hf) -> value or None) -------------------
def _head_width(hf: Mapping[str, Any]) -> int:
    head = hf.get("head_dim") or int(hf["hidden_size"]) // int(hf["num_attention_heads"])
    return int(head)


def _whole_head(key: str) -> Callable[[Any, dict[str, Any]], None]:
    """A key that must be the whole head's width (a family that rotates and sizes every head
    alike, and has no ``head_dim`` of its own)."""

    def read(value: Any, hf: dict[str, Any]) -> None:
        if int(value) != _head_width(hf):
            raise ValueError(f"{key} is {value}, but the heads are {_head_width(hf)} wide")

    return read


def _read_head_dim(value: Any, hf: dict[str, Any]) -> None:
    hf["head_dim"] = int(value)


def _read_gemma_head_dim(value: Any, hf: dict[str, Any]) -> None:
    """Gemma's head width; llama.cpp scales its queries by it (``query_pre_attn_scalar``)."""
    hf["head_dim"] = hf["query_pre_attn_scalar"] = int(value)


def _write_gemma_head_dim(hf: Mapping[str, Any]) -> int:
    head = int(hf["head_dim"])
    scalar = hf.get("query_pre_attn_scalar", head)
    if scalar != head:
        raise ValueError(
            f"query_pre_attn_scalar is {scalar}, not the head width {head}: llama.cpp scales "
            "the queries of this family by the head width"
        )
    return head


def _read_neox_rotary(value: Any, hf: dict[str, Any]) -> None:
    hf["rotary_pct"] = int(value) / _head_width(hf)


def _write_neox_rotary(hf: Mapping[str, Any]) -> int:
    return int(float(hf.get("rotary_pct", 0.25)) * _head_width(hf))


def _read_phi3_rotary(value: Any, hf: dict[str, Any]) -> None:
    hf["partial_rotary_factor"] = int(value) / _head_width(hf)


def _write_phi3_rotary(hf: Mapping[str, Any]) -> int:
    factor = float(hf.get("partial_rotary_factor") or 1.0)
    return int(factor * int(hf["hidden_size"])) // int(hf["num_attention_heads"])


def _read_window(value: Any, hf: dict[str, Any]) -> None:
    hf["sliding_window"] = int(value) or None  # 0: none


def _write_window(hf: Mapping[str, Any]) -> int:
    return int(hf.get("sliding_window") or 0)


def _nothing(hf: Mapping[str, Any]) -> None:
    return None


_ROPE_WHOLE = ("rope.dimension_count", _whole_head("rope.dimension_count"), _head_width)
_ROPE_READ = ("rope.dimension_count", _whole_head("rope.dimension_count"), _nothing)
_WIDTHS_READ = (
    ("attention.key_length", _whole_head("attention.key_length"), _nothing),
    ("attention.value_length", _whole_head("attention.value_length"), _nothing),
)
_WIDTHS = (
    ("attention.key_length", _read_head_dim, lambda hf: hf.get("head_dim")),
    ("attention.value_length", _read_head_dim, lambda hf: hf.get("head_dim")),
)
_GEMMA_WIDTHS = (
    ("attention.key_length", _read_gemma_head_dim, _write_gemma_head_dim),
    ("attention.value_length", _read_gemma_head_dim, _write_gemma_head_dim),
)


def _t5_feed_forward(names: set[str]) -> dict[str, Any]:
    """llama.cpp's T5 feed-forward: gated GELU (tanh) where ``ffn_gate`` tensors are, ReLU
    where not (T5 v1.0)."""
    gated = any(name.endswith(".ffn_gate.weight") for name in names)
    return {"feed_forward_proj": "gated-gelu" if gated else "relu"}


def _llama_or_mixtral(metadata: Mapping[str, Any]) -> str:
    return "mixtral" if metadata.get("llama.expert_count") else "llama"


FAMILIES: dict[str, Family] = {
    family.arch: family
    for family in (
        Family(
            "llama",
            "llama",
            (*_COMMON, ("expert_count", "num_local_experts"),
             ("expert_used_count", "num_experts_per_tok")),
            derived=(*_WIDTHS, _ROPE_WHOLE),
            permute_qk=True,
            choose_model_type=_llama_or_mixtral,
            held={"sliding_window": (None,)},
        ),
        Family("qwen2", "qwen2", _COMMON, derived=(_ROPE_READ, *_WIDTHS_READ)),
        Family("qwen3", "qwen3", _COMMON, derived=(*_WIDTHS, _ROPE_READ)),
        Family("olmo2", "olmo2", _COMMON, derived=(_ROPE_READ, *_WIDTHS_READ)),
        Family(
            "phi3",
            "phi3",
            (*_COMMON,
             ("rope.scaling.original_context_length", "original_max_position_embeddings")),
            derived=(("rope.dimension_count", _read_phi3_rotary, _write_phi3_rotary),
                     ("attention.sliding_window", _read_window, _write_window),
                     *_WIDTHS_READ),
        ),
        Family(
            "gemma2",
            "gemma2",
            (*_COMMON, ("attention.sliding_window", "sliding_window"),
             ("attn_logit_softcapping", "attn_logit_softcapping"),
             ("final_logit_softcapping", "final_logit_softcapping")),
            derived=_GEMMA_WIDTHS,
            norm_shift=1.0,
            swa_period=2,
        ),
        Family(
            "gemma3",
            "gemma3_text",
            (*_COMMON, ("attention.sliding_window", "sliding_window"),
             ("final_logit_softcapping", "final_logit_softcapping")),
            derived=_GEMMA_WIDTHS,
            norm_shift=1.0,
            swa_period=6,
        ),
        Family(
            "gpt2",
            "gpt2",
            (("context_length", "n_positions"), ("embedding_length", "n_embd"),
             ("block_count", "n_layer"), ("feed_forward_length", "n_inner"),
             ("attention.head_count", "n_head"),
             ("attention.layer_norm_epsilon", "layer_norm_epsilon"), ("vocab_size", "vocab_size")),
            conv1d=(".attn_qkv.weight", ".attn_output.weight", ".ffn_up.weight",
                    ".ffn_down.weight"),
            tied_head_copy=True,
        ),
        Family(
            "gptneox",
            "gpt_neox",
            (("context_length", "max_position_embeddings"), ("embedding_length", "hidden_size"),
             ("block_count", "num_hidden_layers"), ("feed_forward_length", "intermediate_size"),
             ("attention.head_count", "num_attention_heads"),
             ("attention.layer_norm_epsilon", "layer_norm_eps"),
             ("use_parallel_residual", "use_parallel_residual"),
             ("rope.freq_base", "rotary_emb_base"), ("vocab_size", "vocab_size")),
            derived=(("rope.dimension_count", _read_neox_rotary, _write_neox_rotary),),
            qkv_per_head=True,
        ),
        Family(
            "t5",
            "t5",
            (("context_length", "n_positions"), ("embedding_length", "d_model"),
             ("feed_forward_length", "d_ff"), ("block_count", "num_layers"),
             ("decoder_block_count", "num_decoder_layers"), ("attention.head_count", "num_heads"),
             ("attention.key_length", "d_kv"), ("attention.value_length", "d_kv"),
             ("attention.layer_norm_epsilon", "layer_norm_epsilon"),
             ("attention.layer_norm_rms_epsilon", "layer_norm_epsilon"),
             ("attention.relative_buckets_count", "relative_attention_num_buckets"),
             ("decoder_start_token_id", "decoder_start_token_id"), ("vocab_size", "vocab_size")),
            held={"relative_attention_max_distance": (128,), "tie_word_embeddings": (False,),
                  "feed_forward_proj": ("gated-gelu", "relu")},
            tensor_facts=_t5_feed_forward,
        ),
    )
}  # fmt: skip


def family_of(arch: str, *, where: str) -> Family:
    """The family of the GGUF architecture ``arch``, or a ``ValueError`` listing those read."""
    try:
        return FAMILIES[arch]
    except KeyError:
        raise ValueError(
            f"{where}: the GGUF architecture {arch!r} is not one zoo reads (it reads "
            f"{', '.join(sorted(FAMILIES))})"
        ) from None


def family_for_model_type(model_type: str) -> Family:
    """The GGUF family a Hugging Face ``model_type`` is written as (Mistral and Mixtral as
    llama.cpp's ``llama``)."""
    aliases = {"mistral": "llama", "mixtral": "llama"}
    for family in FAMILIES.values():
        if family.model_type == model_type or family.arch == aliases.get(model_type):
            return family
    raise ValueError(
        f"zoo writes no GGUF for the Hugging Face model type {model_type!r} (it writes "
        f"{', '.join(sorted({f.model_type for f in FAMILIES.values()} | set(aliases)))})"
    )
