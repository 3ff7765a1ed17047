"""What the encoder-decoder family tests (Marian, BART, T5) compare zoo with transformers on:
random weights large enough that every seam moves the logits, a batch whose source and
target rows are right-padded (as transformers' seq2seq tokenizers pad), the largest logit
difference over the real target tokens, and greedy tokens of a padded batch of sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import zoo


def randomize(model: Any, std: float = 0.1, seed: int = 0) -> None:
    """Every trained tensor of a transformers model drawn from N(0, std) (norms around 1),
    the logits bias too; Marian's fixed position table is left as it is. The encoder's and
    decoder's token embeddings are then ``shared``'s values again where the model has one
    (transformers 5 leaves them apart from it when the head is not tied, which no checkpoint
    of a shared vocabulary is)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and not p.requires_grad:
                continue  # Marian's static sinusoidal table
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(noise + 1.0 if "norm" in name and name.endswith("weight") else noise)
        bias = getattr(model, "final_logits_bias", None)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=g) * std)
        inner = getattr(model, "model", model)
        shared = getattr(inner, "shared", None)
        if shared is not None:
            for stack in (inner.encoder, inner.decoder):
                stack.embed_tokens.weight.copy_(shared.weight)


def save_and_load(model: Any, folder: Path) -> Any:
    """``model.save_pretrained(folder)`` and zoo's load of that folder."""
    model.save_pretrained(folder)
    return zoo.load(folder)


def padded_pair(
    src_vocab: int, tgt_vocab: int, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three source rows of 13 ids (whole, right-padded by 5, by 9) and three target rows of
    10 (right-padded by 4, whole, by 6), with their masks; ids from 3 up (no special id)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, src_vocab, (3, 13), generator=g)
    tgt = torch.randint(3, tgt_vocab, (3, 10), generator=g)
    src_mask, tgt_mask = torch.ones_like(src), torch.ones_like(tgt)
    src_mask[1, 8:], src_mask[2, 4:] = 0, 0
    tgt_mask[0, 6:], tgt_mask[2, 4:] = 0, 0
    return src, src_mask, tgt, tgt_mask


def logits_pair(
    ours: Any, theirs: Any, batch: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """zoo's and transformers' logits over the real target tokens of ``batch``, ``(N, V)``."""
    src, src_mask, tgt, tgt_mask = batch
    with torch.no_grad():
        want = theirs(
            input_ids=src,
            attention_mask=src_mask,
            decoder_input_ids=tgt,
            decoder_attention_mask=tgt_mask,
        ).logits
        got = ours(src, tgt, src_mask, tgt_mask)
    real = tgt_mask.bool()
    return got[real], want[real]


def max_logit_diff(ours: Any, theirs: Any, batch: tuple[torch.Tensor, ...]) -> float:
    """``max |zoo - transformers|`` over the real target tokens of ``batch``."""
    got, want = logits_pair(ours, theirs, batch)
    return float((got - want).abs().max())


def until_end(row: list[int], eos: int) -> list[int]:
    """``row`` up to and including its first ``eos`` (all of it when there is none)."""
    return row[: row.index(eos) + 1] if eos in row[1:] else row


def greedy_pair(
    ours: Any, theirs: Any, sources: list[list[int]], *, start: int, eos: int, new: int = 12
) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy targets of ``sources`` (of different lengths) from ``zoo.generate`` (which
    left-pads them) and from transformers' ``generate`` (right-padded, no forced or banned
    tokens), each row up to its first ``eos``."""
    got = zoo.generate(ours, sources, max_new_tokens=new, temperature=0, start_id=start)
    width = max(len(s) for s in sources)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sources])
    want = theirs.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new,
        do_sample=False,
        num_beams=1,
        decoder_start_token_id=start,
        eos_token_id=eos,
        forced_eos_token_id=None,
        forced_bos_token_id=None,
        bad_words_ids=None,
    )
    return [until_end(r, eos) for r in got], [until_end(r, eos) for r in want.tolist()]


def step_logits_diff(
    ours: Any, theirs: Any, sources: list[list[int]], *, start: int, eos: int, new: int = 8
) -> float:
    """``max |zoo - transformers|`` of the logits of every decoding step of a padded batch:
    zoo's cached session (:func:`zoo.runtime.start_decoding`, the source left-padded) fed
    transformers' greedy tokens, against the raw logits transformers' ``generate`` returns;
    a row's steps after its ``eos`` are left out (transformers feeds it padding)."""
    from zoo.generation.core import left_pad
    from zoo.runtime import start_decoding

    width = max(len(s) for s in sources)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sources])
    out = theirs.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
        do_sample=False, num_beams=1, decoder_start_token_id=start, eos_token_id=eos,
        forced_eos_token_id=None, forced_bos_token_id=None, bad_words_ids=None,
        output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    tokens = out.sequences[:, 1:]  # (B, N)
    want = torch.stack(out.logits, dim=1)  # (B, N, V)
    padded, keep = left_pad(sources, torch.device("cpu"))
    with torch.no_grad():
        session = start_decoding(ours, padded, keep, new, start_id=start)
        got = [session.prefill()]
        got += [session.step(tokens[:, i]) for i in range(tokens.shape[1] - 1)]
    live = torch.ones_like(tokens, dtype=torch.bool)
    live[:, 1:] = (tokens[:, :-1] != eos).cummin(dim=1).values
    return float((torch.stack(got, dim=1) - want)[live].abs().max())


def check_folder(folder: Path, capsys: Any) -> str:
    """``zoo check FOLDER`` (the conformance kit on small random models of the folder's
    architecture and config): every check passes, ``reference`` (against the transformers
    class the layout names) included; returns its output."""
    from zoo.cli import main

    code = main(["check", str(folder), "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    rows = [line.split() for line in out.splitlines() if line.startswith(str(folder))]
    assert all(row[3] == "ok" for row in rows), out
    assert {"decoding", "checkpoint_layouts", "meta", "tied_weights", "reference"} <= {
        r[1] for r in rows
    }
    return out
