"""Hugging Face tokenizer folders for the chat tests: a byte-level BPE without merges (any
text encodes, one id per byte) plus the control tokens of real chat templates, written as
``save_pretrained`` writes them, with a vendored template (tests/data/chat_templates)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"

#: Every control token the vendored templates write, in id order after the 256 bytes.
CONTROL = (
    "<unk>", "<s>", "</s>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "<|user|>", "<|assistant|>", "<|system|>",
)  # fmt: skip
#: Added tokens that are not special (Qwen's tool and thinking tags).
PLAIN = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip


def token_id(token: str) -> int:
    """The id of a control or plain added token in these folders."""
    return 256 + (CONTROL + PLAIN).index(token)


#: Each model's special tokens (tokenizer_config.json) and end ids (generation_config.json),
#: as its Hub repo declares them.
MODELS: dict[str, dict[str, Any]] = {
    "qwen2.5-instruct": {
        "config": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "unk_token": None, "add_bos_token": False},
        "eos_token_id": ["<|im_end|>", "<|endoftext|>"],
    },
    "qwen3": {
        "config": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "unk_token": None, "add_bos_token": False},
        "eos_token_id": ["<|im_end|>", "<|endoftext|>"],
    },
    "smollm2-instruct": {
        "config": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                   "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>"},
        "eos_token_id": "<|im_end|>",  # SmolLM2's generation_config: 2, its <|im_end|>
    },
    "mistral-instruct-v0.3": {
        "config": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "add_bos_token": True, "add_eos_token": False},
        "eos_token_id": "</s>",
    },
    "tinyllama-chat": {
        "config": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "pad_token": "</s>", "add_bos_token": True, "add_eos_token": False},
        "eos_token_id": "</s>",
    },
}  # fmt: skip


def library_tokenizer() -> Any:
    """The ``tokenizers`` byte-level BPE with :data:`CONTROL` and :data:`PLAIN` added."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from zoo.checkpoint.hf_tokenizer import _byte_to_unicode

    vocab = {char: byte for byte, char in _byte_to_unicode().items()}
    library = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    library.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    library.decoder = decoders.ByteLevel()
    library.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL])
    library.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN])
    return library


def write_folder(
    folder: Path,
    model: str,
    *,
    template: str | None = None,
    jinja_file: bool = False,
    generation: bool = True,
) -> Path:
    """A tokenizer folder for ``model`` (a key of :data:`MODELS`) with its vendored template
    (or ``template``; ``""`` for none), in ``tokenizer_config.json`` or, with
    ``jinja_file``, in ``chat_template.jinja`` as transformers 4.43+ writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = MODELS[model]
    library_tokenizer().save(str(folder / "tokenizer.json"))
    source = (TEMPLATES / f"{model}.jinja").read_text() if template is None else template
    decoder = {
        str(token_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": t in CONTROL}
        for t in CONTROL + PLAIN
    }  # fmt: skip
    config = {
        **spec["config"],
        "added_tokens_decoder": decoder,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if source and jinja_file:
        (folder / "chat_template.jinja").write_text(source)
    elif source:
        config["chat_template"] = source
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    if generation:
        ends = spec["eos_token_id"]
        ids = [token_id(t) for t in ends] if isinstance(ends, list) else token_id(ends)
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return folder
