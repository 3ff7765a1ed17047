"""What each key of a Hugging Face ``config.json`` may hold: the types of the keys zoo knows
(:data:`KEY_TYPES`, transformers' annotations) and the keys that never change a forward pass
(:data:`INERT_KEYS`). :class:`~zoo.checkpoint.hf_reader.HFConfigReader` checks a file
against them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "BOOL",
    "FLAG_OR_STRING",
    "INERT_KEYS",
    "INT",
    "KEY_TYPES",
    "LIST",
    "NUMBER",
    "OBJECT",
    "POSITIVE_INT",
    "POSITIVE_NUMBER",
    "STRING",
    "STRINGS",
    "TOKEN_IDS",
    "KeyType",
]


#: Keys of transformers' ``PretrainedConfig`` and of the families zoo reads that never change
#: a forward pass: bookkeeping, token ids, generation defaults, dropouts (zoo reads the one
#: it uses), initialisation, output switches, classification labels, and pure re-orderings
#: of the same arithmetic (``chunk_size_feed_forward``, ``pretraining_tp``).
INERT_KEYS = frozenset(
    {
        "_name_or_path", "architectures", "model_type", "transformers_version", "dtype",
        "torch_dtype", "use_bfloat16", "_attn_implementation", "_commit_hash",
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
        "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id",
        "use_cache", "return_dict", "output_attentions", "output_hidden_states",
        "torchscript", "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward",
        "id2label", "label2id", "num_labels", "problem_type", "finetuning_task",
        "tokenizer_class", "prefix", "task_specific_params", "initializer_range",
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
        "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
        "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
        "output_scores", "return_dict_in_generate", "remove_invalid_values",
        "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
        "attn_pdrop", "embd_pdrop", "resid_pdrop", "attention_dropout", "hidden_dropout",
        "summary_activation", "summary_first_dropout", "summary_proj_to_labels",
        "summary_type", "summary_use_proj", "pretraining_tp", "n_ctx", "gradient_checkpointing",
    }
)  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A JSON number: an int (JSON does not tell 1 from 1.0; JavaScript writers drop the
    ``.0``) or a finite float; never a bool."""
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


@dataclasses.dataclass(frozen=True)
class KeyType:
    """What one ``config.json`` key may hold: a non-null value passes ``test``; null passes
    only when ``null`` (transformers' annotation of the key allows None). ``what`` names the
    type in messages (``"an integer"``)."""

    what: str
    test: Callable[[Any], bool]
    null: bool = False

    @property
    def or_null(self) -> KeyType:
        """The same type, null allowed."""
        return dataclasses.replace(self, null=True)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (parsed JSON) is of this type."""
        return self.null if value is None else self.test(value)

    def __str__(self) -> str:
        return f"{self.what} or null" if self.null else self.what


INT = KeyType("an integer", _is_int)
POSITIVE_INT = KeyType("a positive integer", lambda v: _is_int(v) and v > 0)
NUMBER = KeyType("a number", _is_number)
POSITIVE_NUMBER = KeyType("a positive number", lambda v: _is_number(v) and v > 0)
BOOL = KeyType("true or false", lambda v: isinstance(v, bool))
STRING = KeyType("a string", lambda v: isinstance(v, str))
STRINGS = KeyType(
    "a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
)
LIST = KeyType("a list", lambda v: isinstance(v, list))
OBJECT = KeyType("an object", lambda v: isinstance(v, Mapping))
TOKEN_IDS = KeyType(
    "an integer or a list of integers",
    lambda v: _is_int(v) or (isinstance(v, list) and all(_is_int(x) for x in v)),
)
FLAG_OR_STRING = KeyType("true, false or a string", lambda v: isinstance(v, (bool, str)))

#: The type of every ``config.json`` key zoo knows (read, checked or inert), for every family:
#: :class:`HFConfigReader` checks each key present against it before reading anything, so a
#: value of the wrong type is refused naming the key as written even where another key makes
#: it moot (``sliding_window: "x"`` with ``use_sliding_window: false``). The types are
#: transformers' annotations (the union over the families; a layout narrows one with
#: ``types``), except that an integer is a number (JSON does not tell 1 from 1.0). Sizes are
#: positive, as zoo's configs require.
KEY_TYPES: Mapping[str, KeyType] = {
    # sizes, and the keys that change the arithmetic
    **dict.fromkeys(
        ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "max_position_embeddings", "n_positions", "n_embd", "n_layer",
         "n_head", "num_local_experts", "num_experts_per_tok"),
        POSITIVE_INT,
    ),
    **dict.fromkeys(("num_key_value_heads", "head_dim", "n_inner"), POSITIVE_INT.or_null),
    "sliding_window": INT.or_null, "max_window_layers": INT, "n_special": INT, "n_ctx": INT,
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"), POSITIVE_NUMBER),
    **dict.fromkeys(("rope_theta", "rotary_emb_base"), POSITIVE_NUMBER.or_null),
    **dict.fromkeys(("rotary_pct", "partial_rotary_factor"), NUMBER.or_null),
    "rotary_dim": INT.or_null,
    "rope_parameters": OBJECT.or_null, "rope_scaling": OBJECT.or_null,
    "layer_types": STRINGS.or_null,
    **dict.fromkeys(("hidden_act", "hidden_activation", "activation_function", "afn"), STRING),
    "original_max_position_embeddings": POSITIVE_INT,
    **dict.fromkeys(
        ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window",
         "use_parallel_residual", "rope_interleaved", "scale_attn_weights",
         "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention",
         "is_encoder_decoder", "is_decoder", "is_llama_config", "predict_special_tokens",
         "output_router_logits", "use_cache", "use_bfloat16", "torchscript", "tf_legacy_loss",
         "summary_use_proj", "summary_proj_to_labels", "gradient_checkpointing"),
        BOOL,
    ),
    # inert keys: bookkeeping, token ids, generation defaults, dropouts, labels
    "_name_or_path": STRING, "model_type": STRING, "summary_type": STRING,
    **dict.fromkeys(
        ("transformers_version", "dtype", "torch_dtype", "_attn_implementation",
         "_commit_hash", "problem_type", "finetuning_task", "tokenizer_class", "prefix",
         "summary_activation"),
        STRING.or_null,
    ),
    "architectures": STRINGS.or_null,
    **dict.fromkeys(
        ("bos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
         "forced_bos_token_id", "forced_eos_token_id", "max_length", "min_length",
         "num_beams", "num_beam_groups", "top_k", "no_repeat_ngram_size",
         "encoder_no_repeat_ngram_size", "num_return_sequences", "pretraining_tp"),
        INT.or_null,
    ),
    "eos_token_id": TOKEN_IDS.or_null, "chunk_size_feed_forward": INT, "num_labels": INT,
    **dict.fromkeys(
        ("return_dict", "output_attentions", "output_hidden_states", "do_sample",
         "output_scores", "return_dict_in_generate", "remove_invalid_values"),
        BOOL.or_null,
    ),
    "early_stopping": FLAG_OR_STRING.or_null,
    **dict.fromkeys(
        ("diversity_penalty", "temperature", "top_p", "typical_p", "repetition_penalty",
         "length_penalty"),
        NUMBER.or_null,
    ),
    **dict.fromkeys(
        ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
         "exponential_decay_length_penalty"),
        LIST.or_null,
    ),
    **dict.fromkeys(
        ("initializer_range", "attn_pdrop", "embd_pdrop", "resid_pdrop", "attention_dropout",
         "hidden_dropout", "summary_first_dropout", "router_aux_loss_coef",
         "router_jitter_noise"),
        NUMBER,
    ),
    "classifier_dropout": NUMBER.or_null,
    **dict.fromkeys(("id2label", "label2id", "task_specific_params"), OBJECT.or_null),
    "pruned_heads": OBJECT, "transformers.js_config": OBJECT, "auto_map": OBJECT.or_null,
    "cache_implementation": STRING.or_null, "use_bidirectional_attention": BOOL.or_null,
    # encoder-decoders (Marian, BART, mBART, T5): sizes, switches, dropouts, bookkeeping
    **dict.fromkeys(
        ("d_model", "d_ff", "d_kv", "num_heads", "num_layers", "encoder_layers",
         "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
         "encoder_ffn_dim", "decoder_ffn_dim", "relative_attention_num_buckets",
         "relative_attention_max_distance"),
        POSITIVE_INT,
    ),
    **dict.fromkeys(("num_decoder_layers", "decoder_vocab_size"), POSITIVE_INT.or_null),
    **dict.fromkeys(
        ("scale_embedding", "normalize_before", "normalize_embedding", "add_final_layer_norm",
         "add_bias_logits", "static_position_embeddings", "share_encoder_decoder_embeddings",
         "force_bos_token_to_be_generated", "output_past", "is_gated_act",
         "scale_decoder_outputs"),
        BOOL,
    ),
    **dict.fromkeys(("feed_forward_proj", "dense_act_fn"), STRING),
    **dict.fromkeys(
        ("dropout", "dropout_rate", "activation_dropout", "classif_dropout",
         "encoder_layerdrop", "decoder_layerdrop", "init_std", "initializer_factor"),
        NUMBER,
    ),
    **dict.fromkeys(("_num_labels", "extra_pos_embeddings"), INT),
}  # fmt: skip
