"""The conformance kit's ``reference`` check catches the bugs a round trip cannot: each
planted bug below is its own inverse, so ``checkpoint_layouts`` (zoo -> foreign
-> zoo) passes it, and only running transformers on the same random weights shows it. Each
variant is a test plugin: an architecture on Llama's config and layout with one thing changed.
The same variant without its bug passes, so what fails is the bug, not the plumbing. A check
that cannot run is reported skipped, with its reason, never passed."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor, nn
from zoo_plugins.llama.config import LlamaConfig
from zoo_plugins.llama.convert import LLAMA_CONFIG

import zoo
from zoo.checkpoint.hf_layout import KeyRule, hf_layout
from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv, llama_rules
from zoo.nn import DecoderLM
from zoo.plugin.current import load_registry
from zoo.testing import CheckSkipped, run_check, run_conformance

transformers = pytest.importorskip("transformers")

_TINY = {"vocab_size": 300, "context_length": 64, "d_model": 64, "n_heads": 4,
         "n_kv_heads": 2, "n_layers": 2, "d_ff": 96}  # fmt: skip
_NORMS = tuple(
    f"model.layers.{{i}}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")
)
_V = "model.layers.{i}.self_attn.v_proj.weight"


def _swapped_norms(rules: tuple[KeyRule, ...]) -> tuple[KeyRule, ...]:
    """Llama's rules with the two norms of a block exchanged, both directions."""
    zoo_of = {r.foreign: r.zoo for r in rules}
    swap = {_NORMS[0]: zoo_of[_NORMS[1]], _NORMS[1]: zoo_of[_NORMS[0]]}
    return tuple(dataclasses.replace(r, zoo=swap.get(r.foreign, r.zoo)) for r in rules)


def _swap_v_rows(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """Rows 0 and 1 of every layer's v projection exchanged (as export and import both)."""
    out = dict(state)
    for i in range(config.n_layers):
        v = out[_V.format(i=i)].clone()
        v[[0, 1]] = v[[1, 0]]
        out[_V.format(i=i)] = v
    return out


class CentredRMSNorm(nn.Module):
    """The wrong formula: mean-centred before the root mean square (LayerNorm without a bias,
    where Llama's RMSNorm does not centre)."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x - x.mean(-1, keepdim=True)
        return self.weight * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)


def centred_rmsnorm(config: Any) -> CentredRMSNorm:
    return CentredRMSNorm(config.d_model, config.layer_norm_eps)


def _config(arch: str, **defaults: Any) -> type:
    """LlamaConfig under another architecture name, with other field defaults."""
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in defaults.items()]
    return dataclasses.make_dataclass(
        f"Config_{arch.replace('-', '_')}",
        [("architecture", ClassVar[str], arch), *fields],
        bases=(LlamaConfig,),
        frozen=True,
        kw_only=True,
    )


def _variant(bug: str) -> tuple[type, Any]:
    """The config class and hf-llama layout of ``llama-<bug>``."""
    config = _config(f"llama-{bug}", **({"norm": "centred-rmsnorm"} if bug == "centred" else {}))
    rules = (*llama_rules(), DOWN)
    extra: dict[str, Any] = {}
    if bug == "norms":
        rules = _swapped_norms(rules)
    if bug == "v-rows":
        extra = {"merge_foreign": _swap_v_rows, "split_foreign": _swap_v_rows}
    form = dataclasses.replace(LLAMA_CONFIG, config=config)
    return config, hf_layout(form, rules, fused=(*llama_qkv(), *GATE_UP), **extra)


def own_reference(folder: Path):
    """A plugin's own reference (here transformers' Llama, loaded by hand)."""
    model = transformers.LlamaForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()

    def logits(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            return model(input_ids, attention_mask=attention_mask, position_ids=positions).logits

    return logits


BUGS = ("norms", "v-rows", "centred")


class SharedNorm(DecoderLM):
    """Llama whose two blocks share one attention norm, on purpose."""

    def __init__(self, config: Any, parts: Any = None) -> None:
        super().__init__(config, parts)
        self.blocks[1].attn_norm.weight = self.blocks[0].attn_norm.weight


class _Variants:
    """``llama-<bug>-tiny`` for each planted bug and ``llama-none-tiny`` without one (the
    ``-own`` ones name :func:`own_reference` instead of transformers' class); models the kit
    cannot compare; a model sharing a norm."""

    @zoo.hookimpl
    def zoo_architectures(self) -> list[zoo.ArchitectureSpec]:
        specs = []
        for bug in ("none", *BUGS):
            config, layout = _variant(bug)
            specs.append(
                zoo.ArchitectureSpec(
                    name=f"llama-{bug}",
                    config=config,
                    model=DecoderLM,
                    checkpoint_layouts={"hf-llama": layout},
                )
            )
            own = _config(f"llama-{bug}-own", norm=config.norm)
            specs.append(
                zoo.ArchitectureSpec(
                    name=f"llama-{bug}-own",
                    config=own,
                    model=DecoderLM,
                    checkpoint_layouts={"hf-llama": _variant(bug)[1]},
                    reference=f"{__name__}:own_reference",
                )
            )
        config, layout = _variant("none")
        unknown = dataclasses.replace(
            LLAMA_CONFIG, config=_config("llama-unknown"), architecture="NoSuchForCausalLM"
        )
        specs += [
            zoo.ArchitectureSpec(
                name="llama-unknown",
                config=unknown.config,
                model=DecoderLM,
                checkpoint_layouts={
                    "hf-llama": dataclasses.replace(layout, config_to_foreign=unknown.write)
                },
            ),
            zoo.ArchitectureSpec(
                name="llama-shared", config=_config("llama-shared"), model=SharedNorm
            ),
        ]
        return specs  # fmt: skip

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        archs = [f"llama-{bug}{own}" for bug in ("none", *BUGS) for own in ("", "-own")]
        return [
            *(zoo.ModelSpec(name=f"{arch}-tiny", architecture=arch, config=_TINY)
              for arch in (*archs, "llama-unknown")),
            zoo.ModelSpec(name="llama-none-qkv-bias", architecture="llama-none",
                          config={**_TINY, "qkv_bias": True}),
            zoo.ModelSpec(name="llama-shared-untied", architecture="llama-shared", config=_TINY),
            zoo.ModelSpec(name="llama-shared-tied", architecture="llama-shared",
                          config={**_TINY, "tie_embeddings": True}),
        ]  # fmt: skip

    @zoo.hookimpl
    def zoo_components(self) -> list[zoo.ComponentSpec]:
        return [zoo.ComponentSpec("norm", "centred-rmsnorm", centred_rmsnorm)]


@pytest.fixture
def variants(use_registry: Any) -> None:
    use_registry(load_registry(plugins={"variants": _Variants()}))


@pytest.mark.parametrize("bug", BUGS)
def test_the_reference_check_catches_a_bug_the_round_trip_survives(bug: str, variants) -> None:
    """Swapped norm keys, swapped v rows (both ways) and a wrong norm formula: the layout
    round trip passes each, the reference check fails each (the old kit had no such check)."""
    name = f"llama-{bug}-tiny"
    run_check(name, "checkpoint_layouts")
    with pytest.raises(AssertionError, match=r"hf-llama: logits differ from the reference's by"):
        run_check(name, "reference")
    (result,) = run_conformance(name, checks=["reference"])
    assert result.failed and not result.ok and "logits differ" in result.error


def test_norm_weights_are_randomised_too(variants, monkeypatch) -> None:
    """With the norms left at ones, two swapped norms are the same model: the kit would pass
    the planted bug. Its random weights cover every parameter."""
    from zoo.testing import reference as kit

    real = kit.randomize_parameters

    def ones_for_norms(model: nn.Module, seed: int = 0) -> None:
        real(model, seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)

    monkeypatch.setattr(kit, "randomize_parameters", ones_for_norms)
    run_check("llama-norms-tiny", "reference")  # invisible: why every parameter is drawn


def test_the_variants_without_a_bug_pass(variants) -> None:
    note = run_check("llama-none-tiny", "reference")
    assert note is not None and "hf-llama (LlamaForCausalLM): max logit difference" in note
    assert "greedy tokens equal" in note
    (result,) = run_conformance("llama-none-tiny", checks=["reference"])
    assert result.ok and result.reason == note


@pytest.mark.parametrize("bug", ["none", "norms"])
def test_a_plugin_may_name_its_own_reference(bug: str, variants) -> None:
    name = f"llama-{bug}-own-tiny"
    if bug == "none":
        note = run_check(name, "reference")
        assert note is not None and "own_reference: max logit difference" in note
    else:
        with pytest.raises(AssertionError, match="logits differ"):
            run_check(name, "reference")


def test_greedy_tokens_are_compared(variants, monkeypatch) -> None:
    """A reference without ``generate`` gets a greedy loop over its logits; tokens other
    than zoo.generate's fail, naming both."""
    from zoo.testing import reference as kit

    real = kit._greedy
    monkeypatch.setattr(kit, "_greedy", lambda *a: [[t + 1 for t in row] for row in real(*a)])
    with pytest.raises(AssertionError, match=r"greedy tokens differ: zoo\.generate gives"):
        run_check("llama-none-own-tiny", "reference")


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("transformer-encdec-tiny", "has no reference: no Hugging Face layout"),
        ("llama-none-qkv-bias", r"hf-llama: the layout cannot hold the small model \(qkv_bias"),
        ("llama-unknown-tiny", r"transformers \S+ has no class 'NoSuchForCausalLM'"),
        ("llama-shared-untied", "has no reference"),
    ],
)
def test_a_check_that_cannot_run_is_skipped_with_the_reason(name, reason, variants) -> None:
    with pytest.raises(CheckSkipped, match=reason):
        run_check(name, "reference")
    (result,) = run_conformance(name, checks=["reference"])
    assert result.skipped and not result.ok and not result.failed and result.error is None
    assert result.reason and re.search(reason, result.reason)


def test_without_transformers_the_reference_is_skipped(variants, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(CheckSkipped, match="transformers is not installed"):
        run_check("llama-none-tiny", "reference")


def test_a_layout_that_cannot_hold_the_model_is_named_by_the_round_trip(variants) -> None:
    with pytest.raises(CheckSkipped, match=r"hf-llama cannot hold the small model \(qkv_bias"):
        run_check("llama-none-qkv-bias", "checkpoint_layouts")


def test_the_tied_weights_check_names_what_is_shared(variants) -> None:
    """A norm shared on purpose is not blamed on the embeddings (the old check failed it:
    "tie_embeddings is false but [...] are shared"); what is shared is named."""
    shared = "blocks.0.attn_norm.weight = blocks.1.attn_norm.weight"
    assert run_check("llama-shared-untied", "tied_weights") == f"also shared: {shared}"
    assert run_check("llama-shared-tied", "tied_weights") == f"also shared: {shared}"
