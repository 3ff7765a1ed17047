"""Third-party families need no model code: GPT-J, Cohere and StarCoder2, written
as out-of-tree plugins from the docs alone (``tests/oot_plugins``: a config of other defaults,
the hooks and a Hugging Face layout; no subclass of ``zoo.nn.DecoderLM``), registered with
``zoo.plugin.current.load_registry(plugins=...)`` and held against transformers' own classes
on tiny random configs written with ``save_pretrained``: float32 logits within 1e-5 on a batch with
left and right padding, greedy tokens equal to transformers' ``generate``, the export loaded
back by ``from_pretrained``, ``quantize="int8"`` tracking float (scale included).

What each family proves can be declared: GPT-J one LayerNorm shared by parallel branches
(``block = "parallel_shared"``), biases per site (none on q/k/v/out, MLP and head biased),
partial rotary as a count that no fraction gives (heads of 44, 30 turned) and rotary pairs
of adjacent features (the layout reorders q/k rows). Cohere the same block with a bias-free
LayerNorm, SwiGLU, grouped-query attention, a tied head and a logit scale that int8 keeps.
StarCoder2 ``use_bias: false`` (linears without biases, LayerNorms with them) and a window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import oot_plugins.cohere
import oot_plugins.gptj
import oot_plugins.starcoder2
import pytest
import torch
import transformers
from parity import max_logit_diff, padded_batch

import zoo
from zoo.plugin.current import load_registry

PLUGINS = {"gptj": oot_plugins.gptj, "cohere": oot_plugins.cohere,
           "starcoder2": oot_plugins.starcoder2}  # fmt: skip

_SMALL = {"vocab_size": 300, "max_position_embeddings": 128, "num_hidden_layers": 2}

#: family -> (transformers model class, its config values)
FAMILIES: dict[str, tuple[type, dict[str, Any]]] = {
    "gptj": (transformers.GPTJForCausalLM,
             {"vocab_size": 300, "n_positions": 128, "n_layer": 2, "n_embd": 88, "n_head": 2,
              "n_inner": 128, "rotary_dim": 30}),  # heads of 44, 30 rotary: no fraction of 44
    "cohere": (transformers.CohereForCausalLM,
               {**_SMALL, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 96, "logit_scale": 0.25, "rope_parameters":
                {"rope_type": "default", "rope_theta": 10000.0}}),
    "starcoder2": (transformers.Starcoder2ForCausalLM,
                   {**_SMALL, "hidden_size": 64, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "intermediate_size": 96, "use_bias": False,
                    "sliding_window": 7}),
}  # fmt: skip


def reference(family: str, folder: Path, seed: int = 0) -> torch.nn.Module:
    """transformers' model of ``family``, random (norms and biases too), saved to ``folder``."""
    cls, values = FAMILIES[family]
    torch.manual_seed(seed)
    config = cls.config_class(**values, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = cls(config).eval()
    with torch.no_grad():  # transformers initialises norms to 1 and biases to 0: make them count
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.normal_(1.0, 0.1) if name.endswith("weight") else p.normal_(0.0, 0.1)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def registry() -> Iterator[zoo.plugin.current.Registry]:
    """The installed plugins plus the three out-of-tree ones, for every test of this module."""
    with zoo.use_registry(load_registry(plugins=PLUGINS)) as reg:
        yield reg


@dataclasses.dataclass
class Case:
    family: str
    folder: Path
    theirs: torch.nn.Module
    ours: zoo.nn.ZooModel


@pytest.fixture(scope="module", params=list(FAMILIES))
def case(request: pytest.FixtureRequest, registry: Any, tmp_path_factory: Any) -> Case:
    """transformers' tiny model of one family, saved, and zoo's load of that folder."""
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    theirs = reference(family, folder)
    return Case(family, folder, theirs, zoo.load(folder))


def test_the_plugins_are_declarations_on_the_shared_decoder(case: Case) -> None:
    assert type(case.ours) is zoo.nn.DecoderLM  # no subclass: the plugin declares, zoo builds
    assert type(case.ours.config).architecture == case.family
    assert not any(
        isinstance(v, type) and issubclass(v, torch.nn.Module)
        for module in (PLUGINS[case.family], PLUGINS[case.family].convert)
        for v in vars(module).values()
    ), "a plugin defines a torch module"


def test_logits_match_transformers(case: Case) -> None:
    diff = max_logit_diff(case.ours, case.theirs, *padded_batch(300))
    print(f"{case.family}: max |zoo - transformers| = {diff:.2e}")
    assert diff <= 1e-5


def test_greedy_tokens_equal_transformers_generate(case: Case) -> None:
    prompt = padded_batch(300, seed=3)[0][:1, :10]
    want = case.theirs.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    assert torch.equal(zoo.generate(case.ours, prompt, max_new_tokens=16, temperature=0), want)


def test_export_loads_back_in_transformers(case: Case, tmp_path: Path) -> None:
    zoo.export(case.ours, tmp_path)
    back = FAMILIES[case.family][0].from_pretrained(tmp_path).eval()
    ids, _ = padded_batch(300)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, case.theirs(ids).logits, rtol=0, atol=1e-6)
    again = zoo.load(tmp_path)
    for key, value in case.ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_int8_tracks_float_logit_scale_included(case: Case) -> None:
    """int8 picks the float model's top tokens and keeps the logits' scale: Cohere's 0.25
    dropped would make them 4x too large (the issue's head subclass under ``quantize=``)."""
    quantized = zoo.load(case.folder, quantize="int8")
    assert quantized.config.logit_scale == case.ours.config.logit_scale
    ids, _ = padded_batch(300)
    with torch.no_grad():
        full, small = case.ours(ids), quantized(ids)
    agree = float((full.argmax(-1) == small.argmax(-1)).float().mean())
    assert agree >= 0.9, f"int8 picks the float model's top token at only {agree:.0%}"
    ratio = float(small.std() / full.std())
    assert 0.9 < ratio < 1.1, f"int8 logits are {ratio:.2f}x the float ones in scale"


# -- the conformance kit: each plugin proved against its reference, planted bugs caught ------
def _swap_v_rows(state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """A planted bug: rows 0 and 1 of every ``v_proj`` swapped (its own inverse, so a layout
    that does it on import and on export round-trips)."""
    out = dict(state)
    for key in [k for k in state if k.endswith("attn.v_proj.weight")]:
        out[key] = state[key][[1, 0, *range(2, state[key].shape[0])]]
    return out


class _SwappedV:
    """GPT-J whose layout swaps two ``v_proj`` rows both ways."""

    @zoo.hookimpl
    def zoo_architectures(self) -> list[zoo.ArchitectureSpec]:
        from oot_plugins.gptj import GPTJConfig
        from oot_plugins.gptj.convert import HF_GPTJ, MERGE, SPLIT

        layout = dataclasses.replace(
            HF_GPTJ,
            merge_foreign=lambda s, c: MERGE(_swap_v_rows(s, c), c),
            split_foreign=lambda s, c: _swap_v_rows(SPLIT(s, c), c),
        )
        return [zoo.ArchitectureSpec(name="gptj", config=GPTJConfig, model=zoo.nn.DecoderLM,
                                     checkpoint_layouts={"hf-gptj": layout})]  # fmt: skip

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        return oot_plugins.gptj.zoo_models()


class _RMSCohere:
    """Cohere declared with the wrong norm formula: RMSNorm (no mean-centring) where
    transformers' ``CohereLayerNorm`` subtracts the mean; the keys are the same."""

    @zoo.hookimpl
    def zoo_architectures(self) -> list[zoo.ArchitectureSpec]:
        from oot_plugins.cohere import CohereConfig
        from oot_plugins.cohere.convert import COHERE_CONFIG, HF_COHERE

        @dataclasses.dataclass(frozen=True, kw_only=True)
        class RMSCohereConfig(CohereConfig):
            norm: str = "rmsnorm"

        fmt = dataclasses.replace(COHERE_CONFIG, config=RMSCohereConfig)
        layout = zoo.checkpoint.hf_layout.hf_layout(
            fmt, HF_COHERE.rules, fused=HF_COHERE.fused,
            merge_foreign=HF_COHERE.merge_foreign, split_foreign=HF_COHERE.split_foreign,
        )  # fmt: skip
        return [zoo.ArchitectureSpec(name="cohere", config=RMSCohereConfig,
                                     model=zoo.nn.DecoderLM,
                                     checkpoint_layouts={"hf-cohere": layout})]  # fmt: skip

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        return oot_plugins.cohere.zoo_models()


class _SwappedNorms:
    """StarCoder2 whose layout reads ``input_layernorm`` as the MLP's norm and
    ``post_attention_layernorm`` as attention's (and writes them so: its own inverse)."""

    @zoo.hookimpl
    def zoo_architectures(self) -> list[zoo.ArchitectureSpec]:
        from oot_plugins.starcoder2 import Starcoder2Config
        from oot_plugins.starcoder2.convert import HF_STARCODER2

        swap = {"attn_norm": "ffn_norm", "ffn_norm": "attn_norm"}

        def swapped(rule: zoo.checkpoint.hf_layout.KeyRule) -> zoo.checkpoint.hf_layout.KeyRule:
            parts = rule.zoo.split(".")  # blocks.{i}.attn_norm.weight
            if parts[0] == "blocks" and parts[2] in swap:
                parts[2] = swap[parts[2]]
            return dataclasses.replace(rule, zoo=".".join(parts))

        rules = tuple(swapped(rule) for rule in HF_STARCODER2.rules)
        layout = dataclasses.replace(HF_STARCODER2, rules=rules)
        return [zoo.ArchitectureSpec(name="starcoder2", config=Starcoder2Config,
                                     model=zoo.nn.DecoderLM,
                                     checkpoint_layouts={"hf-starcoder2": layout})]  # fmt: skip

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        return oot_plugins.starcoder2.zoo_models()


TINY = {"gptj": "gptj-tiny", "cohere": "cohere-tiny", "starcoder2": "starcoder2-tiny"}


@pytest.mark.parametrize("family", list(TINY))
def test_the_kit_proves_each_plugin_against_transformers(family: str, registry: Any) -> None:
    from zoo.testing import run_check

    note = run_check(TINY[family], "reference")
    print(f"{family}: {note}")
    assert note is not None and "greedy tokens equal" in note, note


@pytest.mark.parametrize(
    ("plugin", "family"),
    [(_SwappedV(), "gptj"), (_RMSCohere(), "cohere"), (_SwappedNorms(), "starcoder2")],
    ids=["swapped-v", "rmsnorm", "swapped-norms"],
)
def test_the_kit_catches_a_planted_bug_the_round_trip_misses(plugin: Any, family: str) -> None:
    from zoo.testing import run_check

    with zoo.use_registry(load_registry(plugins={family: plugin})):
        run_check(TINY[family], "checkpoint_layouts")  # zoo -> foreign -> zoo: passes
        with pytest.raises(AssertionError, match="differ") as failure:
            run_check(TINY[family], "reference")
    print(f"{family} with a planted bug: {failure.value}")


def test_starcoder2_with_biases_loads_and_exports_exactly(registry: Any, tmp_path: Path) -> None:
    """``use_bias: true`` (StarCoder2's default): the optional bias rules carry every linear
    layer's bias both ways."""
    cls, values = FAMILIES["starcoder2"]
    torch.manual_seed(0)
    theirs = cls(cls.config_class(**{**values, "use_bias": True})).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
    theirs.save_pretrained(tmp_path / "theirs")
    ours = zoo.load(tmp_path / "theirs")
    assert ours.config.bias and ours.blocks[0].ffn.fc.bias is not None
    zoo.export(ours, tmp_path / "ours")
    back = cls.from_pretrained(tmp_path / "ours").eval()
    ids, _ = padded_batch(300)
    with torch.no_grad():
        want = theirs(ids).logits
        torch.testing.assert_close(ours(ids), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(back(ids).logits, want, rtol=0, atol=0)
