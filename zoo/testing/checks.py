"""The conformance checks, one function per check (``check_<name>(model_name, device)``,
returning a note or ``None``; an ``AssertionError`` saying what is wrong; a
:class:`~zoo.testing.reference.CheckSkipped` saying why it cannot run), and :data:`CHECKS`,
the table :func:`zoo.testing.run_check` runs them from."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..api import build, resolve_config
from ..checkpoint.state import tied_groups
from ..generation import generate
from ..nn.base import ZooModel
from ..plugin.current import get_registry
from ..runtime.decoding import start_decoding
from .reference import CheckSkipped, IdsTokenizer, compare_with_architecture_reference
from .small import reference_draws, reference_overrides, small_model

__all__ = ["CHECKS", "DEVICE_FREE", "assert_logits_close"]


def assert_logits_close(actual: Tensor, expected: Tensor, *, atol: float = 1e-5) -> None:
    """Assert two logit tensors match in shape and within ``atol`` (max absolute difference)."""
    if actual.shape != expected.shape:
        raise AssertionError(f"logits shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    diff = (actual.float() - expected.float()).abs().max().item()
    if not diff <= atol:
        raise AssertionError(f"logits differ by {diff:.3g} (tolerance {atol:g})")


def _outputs(model: ZooModel, inputs: dict[str, Tensor]) -> Tensor:
    out = model(**inputs)
    if not isinstance(out, Tensor):
        raise AssertionError(f"forward must return a logits tensor, got {type(out).__name__}")
    return out


def _expected_shape(model: ZooModel, inputs: dict[str, Tensor]) -> tuple[int, ...]:
    ids = [v for k, v in inputs.items() if k.endswith("_ids")]
    config: Any = model.config
    return (*ids[-1].shape, config.vocab_size)


# -- the checks -----------------------------------------------------------------------------
def check_build(name: str, device: str) -> None:
    """Builds; carries its frozen config and name; has parameters on the requested device."""
    model = small_model(name, device)
    if not dataclasses.is_dataclass(model.config):
        raise AssertionError("model.config must be the frozen config dataclass")
    try:
        model.config.d_model = 1  # type: ignore[attr-defined]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("model.config must be frozen")
    if getattr(model, "name", None) != get_registry().model(name).name:
        raise AssertionError(f"model.name is {getattr(model, 'name', None)!r}, expected {name!r}")
    params = list(model.parameters())
    if not params:
        raise AssertionError("model has no parameters")
    wrong = {str(p.device) for p in params if p.device.type != torch.device(device).type}
    if wrong:
        raise AssertionError(f"parameters on {wrong}, expected {device}")


def check_forward(name: str, device: str) -> None:
    """Eval forward gives finite logits ``(B, T, vocab)``, deterministically."""
    model = small_model(name, device).eval()
    inputs = model.example_inputs(generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first, second = _outputs(model, inputs), _outputs(model, inputs)
    if tuple(first.shape) != _expected_shape(model, inputs):
        raise AssertionError(
            f"logits shape {tuple(first.shape)}, expected {_expected_shape(model, inputs)}"
        )
    if not torch.isfinite(first).all():
        raise AssertionError("logits are not finite")
    if not torch.equal(first, second):
        raise AssertionError("two eval forward passes on the same input differ")


def check_backward(name: str, device: str) -> None:
    """A training step's loss reaches every parameter with a finite gradient."""
    model = small_model(name, device).train()
    inputs = model.example_inputs(generator=torch.Generator().manual_seed(0))
    logits = _outputs(model, inputs)
    targets = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    loss = nn.functional.cross_entropy(logits.flatten(0, -2), targets.flatten())
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        raise AssertionError(f"no gradient reached: {missing[:5]}")
    bad = [
        n
        for n, p in model.named_parameters()
        if p.grad is not None and not torch.isfinite(p.grad).all()
    ]
    if bad:
        raise AssertionError(f"non-finite gradients: {bad[:5]}")


class _DeviceWatch(TorchDispatchMode):
    """Records every operation that produces a tensor off the ``meta`` device."""

    def __init__(self) -> None:
        super().__init__()
        self.offenders: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, Tensor) and leaf.device.type != "meta":
                self.offenders.append(f"{func} -> {leaf.device}")
        return out


def check_meta(name: str, device: str) -> None:
    """The full-size model builds and runs on ``meta``, and no operation in build or forward
    creates a tensor anywhere else: no tensor on a hard-coded device."""
    with _DeviceWatch() as watch:
        model = build(name, device="meta").eval()
    inputs = model.example_inputs()
    with watch:
        out = _outputs(model, inputs)
    if watch.offenders:
        raise AssertionError(
            f"tensors created off the requested device: {sorted(set(watch.offenders))[:5]}"
        )
    if out.device.type != "meta":
        raise AssertionError(f"forward on meta produced a tensor on {out.device}")
    if tuple(out.shape) != _expected_shape(model, inputs):
        raise AssertionError(f"meta logits shape {tuple(out.shape)}")


def _shown(groups: list[list[str]]) -> str:
    return "; ".join(" = ".join(group) for group in groups) or "none"


def check_tied_weights(name: str, device: str) -> str | None:
    """``tie_embeddings`` means a token embedding's weight is shared (with the head), and
    false means no embedding weight is; whatever is shared stays shared through dtype and
    device moves. Other shares (a norm used twice on purpose) are allowed and named."""
    model = small_model(name, device)
    tie = getattr(model.config, "tie_embeddings", None)
    groups = tied_groups(model)
    embeddings = {f"{m}.weight" if m else "weight" for m, module in model.named_modules()
                  if isinstance(module, nn.Embedding)}  # fmt: skip
    with_embedding = [g for g in groups if embeddings & set(g)]
    if tie and not with_embedding:
        names = ", ".join(sorted(embeddings))
        raise AssertionError(
            f"config.tie_embeddings is true but no embedding weight ({names}) is shared; "
            f"shared: {_shown(groups)}"
        )
    if tie is False and with_embedding:
        raise AssertionError(
            f"config.tie_embeddings is false but an embedding weight is shared: "
            f"{_shown(with_embedding)}"
        )
    if tied_groups(model.to(torch.bfloat16)) != groups:
        raise AssertionError(f"weight tying was lost by a dtype conversion (was {_shown(groups)})")
    others = [g for g in groups if g not in with_embedding]
    return f"also shared: {_shown(others)}" if others else None


#: How far the logits of a loaded model may be from the saved one's: its tensors are equal,
#: but a tensor read in place from the file may sit at another memory alignment than the
#: original, and some CPU kernels then sum in another order (1e-7 on mixtral-8x7b's experts).
ROUNDTRIP_ATOL = 1e-5


def check_save_load_roundtrip(name: str, device: str) -> None:
    """``zoo.save`` then ``zoo.load`` (safetensors) gives an equal config, equal tensors,
    the same ties and the same logits (to float rounding), on the same device."""
    from ..checkpoint import save
    from ..loading import load

    model = small_model(name, device).eval()
    with tempfile.TemporaryDirectory() as directory:
        save(model, directory)
        loaded = load(directory, device=device, tokenizer=False)
        if loaded.config != model.config:
            raise AssertionError(f"the config differs after loading: {loaded.config}")
        if tied_groups(loaded) != tied_groups(model):
            raise AssertionError(f"ties differ after loading: {tied_groups(loaded)}")
        loaded_state = loaded.state_dict()
        for key, tensor in model.state_dict().items():
            if not torch.equal(loaded_state[key], tensor):
                raise AssertionError(f"tensor {key} differs after the round trip")
        inputs = model.example_inputs(generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            expected = _outputs(model, inputs)
            assert_logits_close(_outputs(loaded, inputs), expected, atol=ROUNDTRIP_ATOL)


def check_dtypes(name: str, device: str) -> None:
    """float32, bfloat16 and float16 builds run and return logits of their dtype."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        model = small_model(name, device, dtype).eval()
        inputs = model.example_inputs(generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            out = _outputs(model, inputs)
        if out.dtype != dtype:
            raise AssertionError(f"{dtype} model returned {out.dtype} logits")
        if not torch.isfinite(out).all():
            raise AssertionError(f"{dtype} logits are not finite")


def check_bad_input(name: str, device: str) -> None:
    """Out-of-range ids, too-long, float, wrong-rank ids and mis-shaped masks are ValueErrors.

    Checked on the CPU whatever ``device``: validation happens before any kernel runs, and on
    CUDA an unchecked out-of-range id is a device-side assert that leaves the process unable
    to run anything on the GPU again (every later check would fail with it)."""
    del device
    model = small_model(name, "cpu").eval()
    inputs = model.example_inputs()
    config: Any = model.config
    ids_key = next(k for k in inputs if k.endswith("_ids"))
    ids = inputs[ids_key]
    too_long = torch.zeros(1, config.context_length + 1, dtype=torch.long, device=ids.device)
    no_mask = {k: v for k, v in inputs.items() if not k.endswith("_mask")}
    cases: dict[str, dict[str, Any]] = {
        "id == vocab_size": no_mask | {ids_key: torch.full_like(ids, config.vocab_size)},
        "negative id": no_mask | {ids_key: torch.full_like(ids, -1)},
        "float ids": no_mask | {ids_key: ids.float()},
        "1-D ids": no_mask | {ids_key: ids[0]},
        "longer than the context": {k: v[:1] for k, v in no_mask.items()} | {ids_key: too_long},
    }
    mask_key = next((k for k in inputs if k.endswith("_mask")), None)
    if mask_key is not None:
        cases["mis-shaped mask"] = inputs | {mask_key: inputs[mask_key][:, :-1]}
    for label, kwargs in cases.items():
        try:
            with torch.no_grad():
                model(**kwargs)
        except ValueError:
            continue
        except Exception as exc:
            raise AssertionError(
                f"{label}: raised {type(exc).__name__} instead of ValueError: {exc}"
            ) from exc
        raise AssertionError(f"{label}: no error raised")


def check_checkpoint_layouts(name: str, device: str) -> str | None:
    """Every declared checkpoint layout that can hold the model (its ``represents``: the
    layout export would refuse is skipped and named, as export refuses it) converts zoo ->
    foreign -> zoo without loss. Skipped when no layout is declared or none can hold it."""
    arch, _, _ = resolve_config(name)
    if not arch.checkpoint_layouts:
        raise CheckSkipped(f"architecture {arch.name!r} declares no checkpoint layout")
    model = small_model(name, device)
    state = model.state_dict()
    skipped = []
    for layout in arch.checkpoint_layouts:
        keymap = arch.checkpoint_layout(layout)
        differs = keymap.misrepresented(model.config)
        if differs:
            skipped.append(f"{layout} cannot hold the small model ({'; '.join(differs)})")
            continue
        foreign, report = keymap.from_zoo(state, model.config)
        if report.unexpected:
            raise AssertionError(f"{layout}: zoo keys with no rule: {list(report.unexpected)}")
        back, report = keymap.to_zoo(foreign, model.config)
        if report.unexpected:
            raise AssertionError(f"{layout}: foreign keys with no rule: {list(report.unexpected)}")
        for key, tensor in state.items():
            if key not in back or not torch.equal(back[key], tensor):
                raise AssertionError(f"{layout}: {key} does not survive the round trip")
    if len(skipped) == len(arch.checkpoint_layouts):
        raise CheckSkipped("; ".join(skipped))
    return f"skipped {'; '.join(skipped)}" if skipped else None


def check_reference(name: str, device: str) -> str | None:
    """The small model, every parameter random, exported to its Hugging Face layout and
    loaded by the ``transformers`` class its config names (or the architecture's own
    ``reference``), gives the reference's logits (<= 1e-4, float32) on prompts of several
    lengths and a left-padded batch, and its greedy tokens (:mod:`zoo.testing.reference`);
    an encoder-decoder's logits on a right-padded batch of sources and targets, greedy tokens
    and beam search (:mod:`zoo.testing.reference_encdec`). transformers must load the
    exported keys exactly (none missing or unexpected) and the config must survive export ->
    transformers -> zoo (:mod:`zoo.testing.config_trip`). Run on each draw of
    :func:`reference_draws`. Skipped, with the reason, when there is no reference to run."""
    del device  # float32 on the CPU, where the reference runs
    arch, _, _ = resolve_config(name)
    notes = []
    for label, small in reference_draws(name, arch):
        torch.manual_seed(0)
        model = build(name, device="cpu", **small)
        try:
            if not model.is_encoder_decoder:
                note = compare_with_architecture_reference(model, arch)
            else:
                note = _encdec_reference(name, arch, model, small)
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from None
        notes.append(f"{label}: {note}")
    return "; ".join(notes)


def _encdec_reference(name: str, arch: Any, model: ZooModel, small: dict[str, Any]) -> str:
    """An encoder-decoder's reference check: logits, greedy decoding and beam search with
    stacks of equal depth (transformers 5's T5 ``generate`` sizes the decoder's cache by the
    encoder's depth, and fails on a deeper decoder), then the logits alone of the shrunk
    model's unequal stacks (so that a layout that swaps the two depths shows)."""
    encoder, decoder = small.get("n_encoder_layers"), small.get("n_decoder_layers")
    if encoder is None or decoder is None or encoder == decoder:
        return compare_with_architecture_reference(model, arch) or ""
    torch.manual_seed(0)
    even = build(name, device="cpu", **(small | {"n_encoder_layers": decoder}))
    note = compare_with_architecture_reference(even, arch)
    unequal = compare_with_architecture_reference(model, arch, generation=False)
    return (
        f"stacks of {decoder} and {decoder} layers: {note}; stacks of {encoder} and {decoder} "
        f"layers, logits only (transformers' T5 cannot decode a deeper decoder): {unequal}"
    )


def _recomputed_logits(
    model: ZooModel, prompt: list[int], forced: list[int], start_id: int
) -> Tensor:
    """The reference: next-token logits ``(len(forced), vocab)`` after the prompt and after
    each forced token, each from ``forward`` over the whole sequence (no session)."""
    device = next(model.parameters()).device
    src = torch.tensor([prompt], device=device)
    head = [start_id] if model.is_encoder_decoder else list(prompt)
    rows = []
    for k in range(len(forced)):
        ids = torch.tensor([head + forced[:k]], device=device)
        logits = model(src, ids) if model.is_encoder_decoder else model(ids)
        rows.append(logits[0, -1])
    return torch.stack(rows)


def _session_logits(
    model: ZooModel, prompts: list[list[int]], forced: list[list[int]], start_id: int
) -> Tensor:
    """Next-token logits ``(B, len(forced[0]), vocab)`` from the model's decoding session over
    the left-padded ``prompts``, fed the ``forced`` tokens one step at a time."""
    device = next(model.parameters()).device
    length = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), length, dtype=torch.long, device=device)
    keep = torch.zeros(len(prompts), length, dtype=torch.bool, device=device)
    for i, prompt in enumerate(prompts):
        ids[i, length - len(prompt) :] = torch.tensor(prompt, device=device)
        keep[i, length - len(prompt) :] = True
    steps = torch.tensor(forced, device=device)  # (B, N)
    session = start_decoding(
        model, ids, None if bool(keep.all()) else keep, steps.shape[1], start_id=start_id
    )
    out = [session.prefill()]
    for k in range(steps.shape[1] - 1):
        out.append(session.step(steps[:, k]))
    return torch.stack(out, dim=1)


def check_decoding(name: str, device: str) -> None:
    """The model's decoding session (its KV cache) gives, step by step, the logits of full
    recomputation; a left-padded batch gives what each prompt gives alone; ``zoo.generate``
    streaming gives the text of plain generation."""
    model = small_model(name, device).eval()
    vocab = model.config.vocab_size  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(0)
    start_id, n = 1, 8
    prompts = [torch.randint(2, vocab, (length,), generator=g).tolist() for length in (7, 3)]
    forced = [torch.randint(2, vocab, (n,), generator=g).tolist() for _ in prompts]
    with torch.no_grad():
        batch = _session_logits(model, prompts, forced, start_id)
        for i, (prompt, tokens) in enumerate(zip(prompts, forced, strict=True)):
            alone = _session_logits(model, [prompt], [tokens], start_id)[0]
            reference = _recomputed_logits(model, prompt, tokens, start_id)
            try:
                assert_logits_close(alone, reference, atol=1e-4)
            except AssertionError as exc:
                raise AssertionError(f"cached decoding differs from recomputation: {exc}") from None
            try:
                assert_logits_close(batch[i], alone, atol=1e-4)
            except AssertionError as exc:
                raise AssertionError(
                    f"prompt {i} decodes differently left-padded in a batch than alone: {exc}"
                ) from None
    ids = IdsTokenizer(vocab)
    text = " ".join(map(str, prompts[0]))
    options: dict[str, Any] = {"tokenizer": ids, "max_new_tokens": n, "start_id": start_id}
    plain = generate(model, text, temperature=0.9, seed=0, **options)
    streamed = "".join(generate(model, text, temperature=0.9, seed=0, stream=True, **options))
    if streamed != plain:
        raise AssertionError(f"streaming gives {streamed!r}, plain generation {plain!r}")


def check_activations(name: str, device: str) -> str:
    """Each activation module of ``zoo.nn``'s table in the reference check's small model
    (its random weights, the model's example inputs), swapped for every other one of the
    table, moves the logits by more than twice the reference tolerance: a plugin that wires
    the wrong activation cannot pass ``reference`` (its logits are within 1e-4 of the
    reference's, the swapped model's then more than 1e-4 away). Fails where a swap is not
    seen (the small geometry hides it); skipped for a model with no such module."""
    from ..nn.feedforward import ACTIVATION_NAMES, activation
    from .reference import REFERENCE_ATOL, randomize_parameters

    del device  # float32 on the CPU, as the reference check
    torch.manual_seed(0)
    model = build(name, device="cpu", **reference_overrides(name))
    randomize_parameters(model)
    model.eval()
    inputs = model.example_inputs(generator=torch.Generator().manual_seed(0))
    places = [
        (owner, child, kind)
        for owner in model.modules()
        for child, module in owner.named_children()
        if (kind := _activation_name(module)) is not None
    ]
    if not places:
        raise CheckSkipped(
            f"{name} has no activation module of zoo.nn's table ({', '.join(ACTIVATION_NAMES)})"
        )
    with torch.no_grad():
        mine = _outputs(model, inputs)
        seen = []
        for own in sorted({kind for _, _, kind in places}):
            mine_here = [(owner, child) for owner, child, kind in places if kind == own]
            originals = [owner._modules[child] for owner, child in mine_here]
            for other in ACTIVATION_NAMES:
                if other == own:
                    continue
                for owner, child in mine_here:
                    setattr(owner, child, activation(other))
                diff = (_outputs(model, inputs) - mine).abs().max().item()
                for (owner, child), original in zip(mine_here, originals, strict=True):
                    setattr(owner, child, original)
                if not diff > 2 * REFERENCE_ATOL:
                    raise AssertionError(
                        f"{other} in place of the model's {own} ({len(mine_here)} modules) moves "
                        f"the logits by only {diff:.3g}: the reference check (tolerance "
                        f"{REFERENCE_ATOL:g}) could not tell them apart on this geometry"
                    )
                seen.append(f"{own} -> {other} {diff:.2g}")
    return f"logits move by: {', '.join(seen)}"


def _activation_name(module: nn.Module) -> str | None:
    """The name ``zoo.nn``'s activation table gives ``module`` (``None``: none)."""
    kind = type(module)
    if kind is nn.GELU:
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    return {nn.ReLU: "relu", nn.SiLU: "silu"}.get(kind)


CHECKS: dict[str, Callable[[str, str], str | None]] = {
    "build": check_build,
    "forward": check_forward,
    "backward": check_backward,
    "meta": check_meta,
    "tied_weights": check_tied_weights,
    "save_load_roundtrip": check_save_load_roundtrip,
    "dtypes": check_dtypes,
    "bad_input": check_bad_input,
    "checkpoint_layouts": check_checkpoint_layouts,
    "decoding": check_decoding,
    "reference": check_reference,
    "activations": check_activations,
}

#: Checks that do not depend on the device (run once, on the CPU).
DEVICE_FREE = frozenset({"meta", "checkpoint_layouts", "reference", "activations"})
