"""SentencePiece vocabularies for the encoder-decoder tests, trained on lines of tinyshakespeare
with the ``sentencepiece`` library (no real OPUS-MT or T5 vocabulary is on this machine): a
trained model, the same model grown to a real vocabulary's size, and Marian's ``vocab.json``
over such models, laid out as OPUS-MT's are (``</s>`` 0, ``<unk>`` 1, ``<pad>`` last)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sentencepiece
from sentencepiece import sentencepiece_model_pb2

__all__ = ["LINES", "filler", "grown_spm", "marian_vocab", "train_spm"]

ROOT = Path(__file__).resolve().parent.parent

#: The non-blank lines of tinyshakespeare, the text every vocabulary here is trained on.
LINES = [
    line
    for line in (ROOT / "plugins/shakespeare/data/tinyshakespeare.txt").read_text().splitlines()
    if line.strip()
]


def train_spm(lines: list[str], prefix: Path, vocab_size: int, **options: Any) -> Path:
    """A SentencePiece model of ``vocab_size`` pieces trained on ``lines``: ``prefix.model``."""
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        minloglevel=2,
        **options,
    )
    return prefix.with_suffix(".model")


def filler(token_id: int) -> str:
    """The piece that stands at ``token_id`` beyond a trained vocabulary: a word of its own
    (``w123``), so text decoded from such ids shows which ids they were."""
    return f"\u2581w{token_id}"


def grown_spm(model: Path, out: Path, pieces: list[str]) -> Path:
    """``model`` with ``pieces`` appended (ordinary pieces scored below every trained one, so
    text encodes as before), written to ``out``: a trained model grown to the size of a real
    one, whose ids a model of that real size can pick."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    lowest = min(p.score for p in proto.pieces)
    for i, piece in enumerate(pieces):
        added = proto.pieces.add()
        added.piece, added.score = piece, lowest - 1.0 - i * 1e-3
        added.type = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
    proto.trainer_spec.vocab_size = len(proto.pieces)
    out.write_bytes(proto.SerializeToString())
    return out


def marian_vocab(
    models: list[Path],
    *,
    drop_every: int = 0,
    codes: tuple[str, ...] = (">>fr<<",),
    size: int | None = None,
) -> dict[str, int]:
    """A Marian ``vocab.json``: ``</s>`` 0, ``<unk>`` 1, the models' pieces, the language
    ``codes`` (as multilingual OPUS-MT models have), ``<pad>`` last; every ``drop_every``-th
    piece left out (those become ``<unk>``). With ``size``, :func:`filler` pieces fill the ids
    up to ``<pad>`` at ``size - 1``, as a real vocabulary of that size has them."""
    vocab = {"</s>": 0, "<unk>": 1}
    for path in models:
        model = sentencepiece.SentencePieceProcessor(model_file=str(path))
        for i in range(model.GetPieceSize()):
            piece = model.IdToPiece(i)
            if piece in ("<unk>", "<s>", "</s>") or (drop_every and i % drop_every == 0):
                continue
            vocab.setdefault(piece, len(vocab))
    for code in codes:
        vocab[code] = len(vocab)
    if size is not None:
        if len(vocab) >= size:
            raise ValueError(f"{len(vocab) + 1} tokens do not fit in a vocabulary of {size}")
        vocab |= {filler(i): i for i in range(len(vocab), size - 1)}
    vocab["<pad>"] = len(vocab)
    return vocab
