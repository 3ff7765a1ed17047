"""The encoder-decoder's decoding session on rows that repeat a source (a beam search's
beams): each distinct source is encoded once, and the session's own ``reorder`` moves the
self-attention cache always and the cross-attention keys, values and source mask only when
a row takes another source's row. Every step's logits are checked against the whole model
run again on each row's source and target so far."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from zoo_plugins.transformer_encdec.model import EncoderDecoderSession, _distinct_sources

import zoo
from zoo.testing import small_overrides

START = 1
#: Logits reach about 20; a cached step and a whole run round apart by up to about 6e-5 (a
#: row given another row's cache or source is off by whole units).
TOLERANCE = 5e-4


@pytest.fixture(scope="module")
def model() -> Any:
    """A tiny transformer-encdec with N(0, 0.5) weight matrices (its rows then differ)."""
    torch.manual_seed(0)
    built = zoo.build("transformer-encdec", **small_overrides("transformer-encdec")).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in built.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return built


def _sources(repeats: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sources (the second padded on the left), each row repeated ``repeats`` times."""
    src = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13]])
    return src.repeat_interleave(repeats, 0), (src != 0).repeat_interleave(repeats, 0)


def _recomputed(model: Any, src: torch.Tensor, keep: torch.Tensor, target: torch.Tensor) -> Any:
    with torch.inference_mode():
        return model(src, target, src_mask=keep)[:, -1]


def test_rows_repeating_a_source_are_found() -> None:
    src, keep = _sources(3)
    firsts, sources = _distinct_sources(src, keep)
    assert firsts is not None and firsts.tolist() == [0, 3]
    assert sources.tolist() == [0, 0, 0, 1, 1, 1]
    keep[4, 0] = True  # the same ids under another mask: a source of its own
    firsts, sources = _distinct_sources(src, keep)
    assert firsts is not None and firsts.tolist() == [0, 3, 4, 5]
    assert sources.tolist() == [0, 0, 0, 1, 2, 3]
    assert _distinct_sources(src[::3], None)[0] is None  # no row repeats: every row encoded


def test_each_distinct_source_is_encoded_once(model, monkeypatch) -> None:
    src, keep = _sources(3)
    encoded: list[int] = []
    encode = model._encode

    def counting(ids: torch.Tensor, mask: Any) -> Any:
        encoded.append(ids.shape[0])
        return encode(ids, mask)

    monkeypatch.setattr(model, "_encode", counting)
    with torch.inference_mode():
        session = model.start_decoding(src, keep, 4, start_id=START)
        logits = session.prefill()
    assert encoded == [2]
    target = torch.full((6, 1), START)
    assert torch.allclose(logits, _recomputed(model, src, keep, target), atol=TOLERANCE)


#: Reorders of six rows (two sources of three rows): within each source's rows, across the
#: sources (whole groups swapped), and mixed (rows of one source taking the other's).
INDEXES = [[1, 0, 0, 5, 3, 4], [3, 4, 5, 0, 1, 2], [0, 0, 3, 3, 4, 1], [2, 2, 2, 5, 5, 5]]


@pytest.mark.parametrize("repeats", [3, 1])
def test_reordered_rows_step_as_recomputation_does(model, repeats: int) -> None:
    """Each reorder then a step: the logits of every row are those of the model run on that
    row's source and whole target (sources repeated three times, or six distinct rows)."""
    src, keep = _sources(repeats)
    if repeats == 1:  # six rows, each its own source
        src, keep = torch.cat([src, src.flip(1), src + 1]), torch.cat([keep, keep.flip(1), keep])
    g = torch.Generator().manual_seed(1)
    target = torch.full((6, 1), START)
    with torch.inference_mode():
        session = model.start_decoding(src, keep, len(INDEXES) + 1, start_id=START)
        assert isinstance(session, EncoderDecoderSession)
        session.prefill()
        for index in map(torch.tensor, INDEXES):
            session.reorder(index)
            src, keep, target = src[index], keep[index], target[index]
            tokens = torch.randint(2, 20, (6,), generator=g)
            target = torch.cat([target, tokens[:, None]], dim=1)
            got = session.step(tokens)
            want = _recomputed(model, src, keep, target)
            assert torch.allclose(got, want, atol=TOLERANCE), index
