"""Tiny Marian, BART and T5 folders for the fine-tuning and adapter tests: random weights
(:func:`seq2seq_parity.randomize`) of transformers' classes, no dropout, saved with
``save_pretrained`` next to a word-level ``tokenizer.json`` whose sequence tokens are the
family's (``text </s>`` for Marian and T5, ``<s> text </s>`` for BART) and whose special ids
are the family's (Marian: eos 0, pad last = its decoder start; BART: bos 0, pad 1, eos 2 =
its decoder start; T5: pad 0 = its decoder start, eos 1). ``zoo.load`` of a folder brings
that tokenizer and the ``decoder_start_token_id`` of its ``generation_config.json``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
import transformers
from seq2seq_parity import randomize

#: Families and the sizes of their tiny folders.
FAMILIES = ("marian", "bart", "t5")
VOCAB = 99
WORDS = [f"w{i}" for i in range(60)]
_STACKS = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
           "decoder_attention_heads": 4, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48,
           "d_model": 32, "max_position_embeddings": 64, "dropout": 0.0,
           "attention_dropout": 0.0, "activation_dropout": 0.0}  # fmt: skip


def _word_tokenizer(specials: dict[str, int], template: str, **roles: str) -> Any:
    """A word-level tokenizer of :data:`VOCAB` ids: ``specials`` at their ids, the
    :data:`WORDS`, filler words; ``template`` is its post-processor (its sequence tokens)."""
    import tokenizers
    from tokenizers import models, pre_tokenizers, processors

    slots = [i for i in range(VOCAB) if i not in specials.values()]
    words = [*WORDS, *(f"x{i}" for i in range(VOCAB))]
    vocab = {**dict(zip(words, slots, strict=False)), **specials}
    library = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    library.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    used = [(token, i) for token, i in specials.items() if token in template.split()]
    library.post_processor = processors.TemplateProcessing(single=template, special_tokens=used)
    library.add_special_tokens(list(specials))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=library, **roles)


def build(family: str) -> tuple[Any, Any]:
    """transformers' tiny model of ``family`` (random weights, seed 0) and its tokenizer."""
    torch.manual_seed(0)
    if family == "marian":
        config = transformers.MarianConfig(
            vocab_size=VOCAB, pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1,
            eos_token_id=0, **_STACKS,
        )  # fmt: skip
        model: Any = transformers.MarianMTModel(config)
        specials = {"</s>": 0, "<unk>": 1, "<pad>": VOCAB - 1}
        tok = _word_tokenizer(specials, "$A </s>", eos_token="</s>", unk_token="<unk>",
                              pad_token="<pad>")  # fmt: skip
    elif family == "bart":
        model = transformers.BartForConditionalGeneration(
            transformers.BartConfig(vocab_size=VOCAB, **_STACKS)
        )
        specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        tok = _word_tokenizer(specials, "<s> $A </s>", bos_token="<s>", eos_token="</s>",
                              unk_token="<unk>", pad_token="<pad>")  # fmt: skip
    elif family == "t5":  # v1.1 (Flan-T5): gated GELU, a head of its own
        config = transformers.T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
            feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
            relative_attention_num_buckets=8, relative_attention_max_distance=12,
            decoder_start_token_id=0,
        )  # fmt: skip
        model = transformers.T5ForConditionalGeneration(config)
        specials = {"<pad>": 0, "</s>": 1, "<unk>": 2}
        tok = _word_tokenizer(specials, "$A </s>", eos_token="</s>", unk_token="<unk>",
                              pad_token="<pad>")  # fmt: skip
    else:
        raise ValueError(family)
    randomize(model, std=0.15)
    return model.eval(), tok


def save_folder(family: str, folder: Path) -> tuple[Any, Any]:
    """:func:`build`'s model and tokenizer saved in ``folder``; both returned."""
    model, tok = build(family)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


def reload(folder: Path) -> Any:
    """transformers' model of ``folder`` (its class from the config)."""
    return transformers.AutoModelForSeq2SeqLM.from_pretrained(folder)


def pairs(count: int = 24, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` source/target pairs of 1-9 and 1-7 words."""
    rng = random.Random(seed)
    return [
        (" ".join(rng.choices(WORDS, k=rng.randint(1, 9))),
         " ".join(rng.choices(WORDS, k=rng.randint(1, 7))))
        for _ in range(count)
    ]  # fmt: skip


def write_pairs(path: Path, rows: list[tuple[str, str]]) -> Path:
    """``rows`` as a ``source<TAB>target`` file."""
    path.write_text("".join(f"{s}\t{t}\n" for s, t in rows))
    return path


def hf_batch(tok: Any, rows: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """transformers' batch of ``rows``: ``input_ids``, ``attention_mask`` and ``labels``
    right-padded, the labels' padding -100 (``DataCollatorForSeq2Seq``'s)."""
    enc = tok([s for s, _ in rows], text_target=[t for _, t in rows], padding=True,
              return_tensors="pt")  # fmt: skip
    labels = enc["labels"].masked_fill(enc["labels"] == tok.pad_token_id, -100)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
            "labels": labels}  # fmt: skip
