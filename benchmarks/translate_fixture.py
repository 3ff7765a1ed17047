"""The translation benchmark's model: ``Helsinki-NLP/opus-mt-en-de``'s shape with random
weights, as transformers, zoo and CTranslate2 each read it.

The Hub is not reachable here, so nothing is vendored: :data:`CONFIG` is written from the
published ``config.json`` of ``opus-mt-en-de`` (transformers' ``MarianConfig`` defaults plus
the values that model's file sets: 512 wide, 6 + 6 layers of 8 heads, a 2048-wide swish
feed-forward, 58101 shared tokens with ``<pad>`` = 58100 the decoder's start, ``</s>`` = 0,
scaled embeddings, static sinusoidal positions for 512 tokens, post-norm layers), and
:data:`GENERATION` from its ``generation_config.json`` (4 beams, ``<pad>`` never generated,
``max_length`` 512). The weights are transformers' own initialisation of ``MarianMTModel``
under a fixed seed. The tokenizer is a SentencePiece model trained here on Tiny Shakespeare
(the shakespeare plugin's text, first 90%) and used for both sides, as OPUS-MT's pair is;
its ``vocab.json`` maps ``</s>``, ``<unk>`` and the pieces to the first ids and fills the
rest of the 58101 ids with unused tokens up to ``<pad>``, so the vocabulary has the model's
size. CTranslate2's models are ``ct2-transformers-converter``'s conversions of the folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

#: ``opus-mt-en-de``'s config.json values over transformers' ``MarianConfig`` defaults.
CONFIG: dict[str, Any] = {
    "architectures": ["MarianMTModel"],
    "activation_function": "swish",
    "d_model": 512,
    "encoder_layers": 6,
    "decoder_layers": 6,
    "encoder_attention_heads": 8,
    "decoder_attention_heads": 8,
    "encoder_ffn_dim": 2048,
    "decoder_ffn_dim": 2048,
    "vocab_size": 58101,
    "decoder_vocab_size": 58101,
    "max_position_embeddings": 512,
    "scale_embedding": True,
    "share_encoder_decoder_embeddings": True,
    "static_position_embeddings": True,
    "normalize_before": False,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "decoder_start_token_id": 58100,
    "forced_eos_token_id": 0,
}

#: ``opus-mt-en-de``'s generation_config.json values the benchmark's engines read.
GENERATION: dict[str, Any] = {
    "bad_words_ids": [[58100]],
    "decoder_start_token_id": 58100,
    "eos_token_id": 0,
    "forced_eos_token_id": 0,
    "max_length": 512,
    "num_beams": 4,
    "pad_token_id": 58100,
}

PAD, EOS = CONFIG["pad_token_id"], CONFIG["eos_token_id"]
SEED = 0
PIECES = 8000  # SentencePiece's vocabulary; the remaining ids are unused fillers


def shakespeare() -> str:
    """Tiny Shakespeare, from the shakespeare plugin's data."""
    data = resources.files("zoo_plugins.shakespeare").joinpath("data", "tinyshakespeare.txt")
    return data.read_text()


def _train_pieces(folder: Path) -> Path:
    """A unigram SentencePiece model on the first 90% of Tiny Shakespeare."""
    import sentencepiece

    text = shakespeare()
    corpus = folder / "train.txt"
    corpus.write_text(text[: int(len(text) * 0.9)])
    prefix = folder / "pieces"
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=PIECES,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=2,
        minloglevel=2,
    )
    corpus.unlink()
    return prefix.with_suffix(".model")


def _vocabulary(model: Path) -> dict[str, int]:
    """``</s>`` 0, ``<unk>`` 1, the pieces, fillers, ``<pad>`` last: the model's 58101 ids."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(model))
    specials = {"</s>", "<unk>", "<s>", "<pad>"}
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    tokens = ["</s>", "<unk>", *(p for p in pieces if p not in specials)]
    tokens += [f"<unused{i}>" for i in range(PAD - len(tokens))]
    tokens.append("<pad>")
    assert len(tokens) == CONFIG["vocab_size"]
    return {token: i for i, token in enumerate(tokens)}


def _save_hf(folder: Path) -> None:
    """``MarianMTModel`` with seeded random weights and its tokenizer, saved by transformers."""
    import torch
    import transformers

    spm = _train_pieces(folder)
    (folder / "vocab.json").write_text(json.dumps(_vocabulary(spm), ensure_ascii=False))
    for side in ("source", "target"):
        shutil.copy(spm, folder / f"{side}.spm")
    spm.unlink()
    spm.with_suffix(".vocab").unlink()
    tokenizer = transformers.MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")
    )
    torch.manual_seed(SEED)
    model = transformers.MarianMTModel(transformers.MarianConfig(**CONFIG)).eval()
    model.generation_config = transformers.GenerationConfig(**GENERATION)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _convert(folder: Path, output: Path, quantization: str) -> None:
    """CTranslate2's conversion of the transformers folder (its converter reads Marian)."""
    converter = Path(sys.executable).with_name("ct2-transformers-converter")
    command = [str(converter), "--model", str(folder), "--output_dir", str(output)]
    subprocess.run([*command, "--quantization", quantization], check=True, capture_output=True)


def build(workdir: Path, *, ct2: bool = True) -> dict[str, Path]:
    """The folders (built once in ``workdir``, reused after): ``"hf"`` transformers' (which
    zoo loads too), ``"ct2 float32"`` and ``"ct2 int8"`` CTranslate2's when ``ct2``."""
    folders = {"hf": workdir / "opus-mt-en-de-random"}
    done = folders["hf"] / "done"
    if not done.exists():
        shutil.rmtree(folders["hf"], ignore_errors=True)
        folders["hf"].mkdir(parents=True)
        _save_hf(folders["hf"])
        done.write_text(json.dumps({"config": CONFIG, "seed": SEED}))
    for quantization in ("float32", "int8") if ct2 else ():
        output = workdir / f"ct2-{quantization}"
        if not (output / "model.bin").exists():
            _convert(folders["hf"], output, quantization)
        folders[f"ct2 {quantization}"] = output
    return folders


def sources(tokenizer: Any, count: int, lo: int = 10, hi: int = 40) -> list[list[int]]:
    """``count`` lines of held-out Tiny Shakespeare (its last 10%, in order) whose source ids
    (``</s>`` included) number ``lo`` to ``hi``."""
    text = shakespeare()
    found: list[list[int]] = []
    for line in text[int(len(text) * 0.9) :].splitlines():
        ids = tokenizer(line.strip())["input_ids"] if line.strip() else []
        if lo <= len(ids) <= hi:
            found.append(list(ids))
            if len(found) == count:
                return found
    raise ValueError(f"Tiny Shakespeare's held-out part has fewer than {count} such lines")
