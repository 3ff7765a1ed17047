"""The kit's ``reference`` check: a model against the implementation it reproduces.

A round trip zoo -> foreign -> zoo (``checkpoint_layouts``) cannot see a bug that is its own
inverse: two norm keys swapped in a layout (both directions), two rows of ``v`` swapped by a
transform and swapped back, a norm with the wrong formula. Only running the reference
implementation on the same weights does. So this check

1. builds the small model and gives EVERY parameter random values (norm weights and biases
   included: with norms all ones, two swapped norms are the same model), seeded;
2. writes it as the reference reads it: :func:`zoo.export` to the architecture's Hugging Face
   layout, or ``zoo.save`` for a plugin reference on an architecture without one;
3. loads the reference: the ``transformers`` class the written ``config.json`` names in
   ``architectures`` (``from_pretrained(folder, dtype=float32, attn_implementation="eager")``),
   or the plugin's own (:attr:`zoo.ArchitectureSpec.reference`, see :data:`ReferenceFactory`);
4. compares logits (max absolute difference <= :data:`REFERENCE_ATOL`, float32) on prompts of
   several lengths, each alone and together as a left-padded batch with an attention mask (real
   positions only), and the greedy tokens of :func:`zoo.generate` (temperature 0) with the
   reference's (``generate`` of transformers, or a greedy loop over the plugin's callable).

It is skipped, with the reason, when it cannot run: no reference (no Hugging Face layout and no
``reference=``), a layout that cannot hold the small model, a layout that writes no
``config.json``, ``transformers`` not installed, or no installed ``transformers`` class of the
name the config gives.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor, nn

from .config_trip import check_config_trip
from .hf_reference import (
    REFERENCE_ATOL,
    CheckSkipped,
    IdsTokenizer,
    install_line,
    transformers_reference,
)
from .reference_encdec import (
    compare_encdec_with_reference,
    load_encdec_reference,
    randomize_buffers,
)

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from ..plugin.specs import ArchitectureSpec

__all__ = [
    "REFERENCE_ATOL",
    "CheckSkipped",
    "IdsTokenizer",
    "Reference",
    "ReferenceFactory",
    "compare_with_architecture_reference",
    "compare_with_reference",
    "install_line",
    "randomize_parameters",
    "transformers_reference",
]


#: Prompt lengths compared (each alone, then together as one left-padded batch).
PROMPT_LENGTHS = (9, 4, 1)

#: Greedy tokens compared after each of two prompts.
GREEDY_TOKENS = 16


class Reference(Protocol):
    """A reference implementation loaded for one model: ``(input_ids, attention_mask) ->
    logits``.

    Shape:
        ``input_ids``: ``(B, T)`` int64, left-padded; ``attention_mask``: ``(B, T)`` int64, 1 on
        real tokens, 0 on padding; returned: ``(B, T, vocab)`` float logits (padded positions
        are not compared). Positions count real tokens only (the first real token is at 0).

    It may also have ``generate(input_ids, attention_mask, max_new_tokens) -> (B, N)`` new ids
    (greedy); without it the kit generates greedily by calling the reference on the growing
    sequence.
    """

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor: ...


#: What :attr:`zoo.ArchitectureSpec.reference` names: called with the folder the kit wrote the
#: model to (what :func:`zoo.export` writes for an architecture with a Hugging Face layout that
#: can hold the model, else what :func:`zoo.save` writes), it returns the :class:`Reference`.
ReferenceFactory = Callable[[Path], Reference]


# -- random weights -------------------------------------------------------------------------
def randomize_parameters(model: nn.Module, seed: int = 0) -> None:
    """Give every parameter of ``model`` seeded random values, in place: 1-D weights (norm
    scales, whatever their formula) uniform in [0.5, 1.5), biases normal with std 0.1, every
    other tensor normal with std ``1 / sqrt(its last dimension)`` (logits of order one). A
    tied parameter is drawn once."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and not name.endswith("bias"):
                values = torch.rand(p.shape, generator=g) + 0.5
            elif p.ndim == 1:
                values = torch.randn(p.shape, generator=g) * 0.1
            else:
                values = torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5
            p.copy_(values.to(p.dtype))


# -- the comparison -------------------------------------------------------------------------
def _left_padded(prompts: Sequence[list[int]]) -> tuple[Tensor, Tensor]:
    """``(ids, mask)``, both ``(B, T)`` int64, the prompts right-aligned (padding id 0)."""
    length = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), length, dtype=torch.long)
    mask = torch.zeros(len(prompts), length, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, length - len(prompt) :] = torch.tensor(prompt)
        mask[i, length - len(prompt) :] = 1
    return ids, mask


def _greedy(reference: Reference, prompts: Sequence[list[int]], n: int) -> list[list[int]]:
    """``n`` greedy tokens after each prompt: the reference's ``generate``, or a loop over
    the reference on the growing left-padded sequence."""
    ids, mask = _left_padded(prompts)
    generate = getattr(reference, "generate", None)
    if generate is not None:
        return generate(ids, mask, n).tolist()
    for _ in range(n):
        nxt = reference(ids, mask)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        ids, mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
    return ids[:, -n:].tolist()


def _tie(reference: Reference, prompt: list[int], got: list[int], expected: list[int]) -> bool:
    """Whether the first token where ``got`` leaves ``expected`` was a near tie for the
    reference (its two logits within :data:`REFERENCE_ATOL`): then either pick is right."""
    k = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
    ids = torch.tensor([prompt + got[:k]])
    with torch.no_grad():
        logits = reference(ids, torch.ones_like(ids))[0, -1]
    return abs(float(logits[got[k]] - logits[expected[k]])) <= REFERENCE_ATOL


def _max_diff(actual: Tensor, expected: Tensor, what: str) -> float:
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{what}: logits of shape {tuple(actual.shape)}, the reference's "
            f"{tuple(expected.shape)}"
        )
    return (actual.float() - expected.float()).abs().max().item()


def compare_with_reference(model: ZooModel, reference: Reference, *, seed: int = 0) -> float:
    """Compare ``model`` (on the CPU, float32, eval) with ``reference`` on the same weights:
    logits of each prompt alone and of a left-padded batch (real positions), and greedy
    tokens. Returns the largest logit difference.

    Raises:
        AssertionError: a difference above :data:`REFERENCE_ATOL` (saying where and how much)
            or different greedy tokens.
    """
    from ..generation import generate

    vocab: int = model.config.vocab_size  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    worst = 0.0
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            ours = model(ids)
            diff = _max_diff(ours, reference(ids, torch.ones_like(ids)), "a prompt")
            if not diff <= REFERENCE_ATOL:
                raise AssertionError(
                    f"logits differ from the reference's by {diff:.3g} on a prompt of "
                    f"{len(prompt)} tokens (tolerance {REFERENCE_ATOL:g})"
                )
            worst = max(worst, diff)
        ids, mask = _left_padded(prompts)
        ours = model(ids, attention_mask=mask.bool())
        theirs = reference(ids, mask)
        real = mask.bool()
        diff = _max_diff(ours[real], theirs[real], "the left-padded batch")
        if not diff <= REFERENCE_ATOL:
            raise AssertionError(
                f"logits differ from the reference's by {diff:.3g} on a left-padded batch of "
                f"prompts of {', '.join(map(str, PROMPT_LENGTHS))} tokens, real positions "
                f"(tolerance {REFERENCE_ATOL:g})"
            )
        worst = max(worst, diff)
    pair = prompts[:2]
    expected = _greedy(reference, pair, GREEDY_TOKENS)
    ids_only: Any = IdsTokenizer(vocab)  # no end-of-text: every token is generated
    out = generate(model, pair, tokenizer=ids_only, max_new_tokens=GREEDY_TOKENS, temperature=0.0)
    got = [row[len(prompt) :] for row, prompt in zip(out, pair, strict=True)]
    rows = zip(pair, got, expected, strict=True)
    if not all(mine == theirs or _tie(reference, p, mine, theirs) for p, mine, theirs in rows):
        raise AssertionError(
            f"greedy tokens differ: zoo.generate gives {got}, the reference {expected} "
            f"(largest logit difference {worst:.3g})"
        )
    return worst


def _write(model: ZooModel, folder: Path, layout: str | None) -> None:
    from ..checkpoint import save
    from ..checkpoint.write import export

    if layout is None:
        save(model, folder)
    else:
        export(model, folder, layout)


def _loading_note(reference: Any) -> str:
    info = getattr(reference, "loading_info", None)
    return f"; transformers reported {info}" if info else ""


def _hf_layouts(arch: ArchitectureSpec) -> list[str]:
    from ..checkpoint.write import hf_layouts as layouts

    return layouts(arch)


def compare_with_architecture_reference(
    model: ZooModel, arch: ArchitectureSpec, *, generation: bool = True
) -> str | None:
    """The ``reference`` check on ``model`` (small, CPU). Returns a note when some layout was
    skipped and another compared; raises :class:`CheckSkipped` when none could run and
    ``AssertionError`` on a difference.

    An encoder-decoder is compared with the ``transformers`` class each of its Hugging Face
    layouts names (:mod:`zoo.testing.reference_encdec`): logits, and with ``generation``
    greedy decoding and a beam search too (``False``: logits only)."""
    layouts = _hf_layouts(arch)
    if arch.reference is None and not layouts:
        raise CheckSkipped(
            f"architecture {arch.name!r} has no reference: no Hugging Face layout (a "
            "checkpoint layout with a model_type) and no ArchitectureSpec(reference=...)"
        )
    if model.is_encoder_decoder:
        return _compare_encdec(model, arch, layouts, generation)
    randomize_parameters(model)
    model.eval()
    if arch.reference is not None:
        factory = arch.reference_factory
        usable = [lay for lay in layouts if not _unwritable(arch, lay, model)]
        with tempfile.TemporaryDirectory() as folder:
            _write(model, Path(folder), usable[0] if usable else None)
            reference = factory(Path(folder))
            worst = compare_with_reference(model, reference)
        named = (
            arch.reference
            if isinstance(arch.reference, str)
            else getattr(factory, "__qualname__", factory)
        )
        return f"{named}: max logit difference {worst:.2g}, greedy tokens equal"

    def against_transformers(folder: Path) -> str:
        reference = transformers_reference(folder)
        try:
            worst = compare_with_reference(model, reference)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{_loading_note(reference)}") from None
        name = type(reference.model).__name__
        return f"({name}): max logit difference {worst:.2g}, greedy tokens equal"

    return _over_layouts(model, arch, layouts, against_transformers)


def _compare_encdec(
    model: ZooModel, arch: ArchitectureSpec, layouts: list[str], generation: bool
) -> str:
    """The encoder-decoder's comparison with the ``transformers`` class of each layout."""
    if not layouts:
        raise CheckSkipped(
            f"architecture {arch.name!r} is an encoder-decoder without a Hugging Face layout: "
            "its reference= is not run (the kit compares an encoder-decoder with the "
            "transformers class its layout names)"
        )
    randomize_parameters(model)
    randomize_buffers(model)
    model.eval()
    config: Any = model.config
    start = config.decoder_start_id if config.decoder_start_id is not None else 0

    def against_transformers(folder: Path) -> str:
        reference = load_encdec_reference(folder)
        try:
            note = compare_encdec_with_reference(
                model, reference, start=start, generation=generation
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}{_loading_note(reference)}") from None
        return f"({type(reference.model).__name__}): {note}"

    return _over_layouts(model, arch, layouts, against_transformers)


def _over_layouts(
    model: ZooModel, arch: ArchitectureSpec, layouts: list[str], compare: Callable[[Path], str]
) -> str:
    """``compare`` run on a folder of each layout that can hold ``model`` (written by
    :func:`zoo.export`); a layout it cannot hold, or whose reference cannot load
    (:class:`CheckSkipped` from ``compare``), is named as skipped."""
    skipped: list[str] = []
    compared: list[str] = []
    for layout in layouts:
        why = _unwritable(arch, layout, model)
        if why:
            skipped.append(f"{layout}: {why}")
            continue
        with tempfile.TemporaryDirectory() as folder:
            _write(model, Path(folder), layout)
            try:
                note = compare(Path(folder))
                trip = check_config_trip(arch, layout, model.config, Path(folder))
                compared.append(f"{layout} {note}, {trip}")
            except CheckSkipped as exc:
                skipped.append(f"{layout}: {exc}")
            except AssertionError as exc:
                raise AssertionError(f"{layout}: {exc}") from None
    if not compared:
        raise CheckSkipped("; ".join(skipped))
    return "; ".join(compared + [f"skipped {s}" for s in skipped])


def _unwritable(arch: ArchitectureSpec, layout: str, model: ZooModel) -> str | None:
    """Why ``layout`` cannot be written for ``model`` (None when it can)."""
    keymap = arch.checkpoint_layout(layout)
    if keymap.config_to_foreign is None:
        return "the layout writes no config.json"
    differs = keymap.misrepresented(model.config)
    if differs:
        return f"the layout cannot hold the small model ({'; '.join(differs)})"
    try:
        keymap.config_to_foreign(model.config)
    except (ValueError, KeyError) as exc:
        return f"the layout cannot write the small model's config.json ({exc})"
    return None
