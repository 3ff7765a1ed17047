"""Gemma 2 against transformers' ``Gemma2ForCausalLM`` where the shared cases of
``tests/test_families.py`` cannot say it: soft-caps small enough to bite and a window shorter
than the prompt (so a dropped cap or a wrong window fails), the tied head and transformers'
``layer_types`` default (the official config.json has no ``layer_types``), greedy tokens of
eager decoding and of the serving slot batch (``compile=True``: the ``compiled`` case of
tests/test_families.py), the export's integer ``query_pre_attn_scalar``, the keys zoo cannot
honour refused by name, the named model at full size, the kit's reference check against
planted bugs, and the chat template.

One transformers model is built for the module (3 layers: sliding, full, sliding; window 4;
score cap 5, logit cap 3; weights N(0, 0.1) so every seam moves the logits).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from parity import max_logit_diff
from planted import Planted, swap_foreign
from zoo_plugins.gemma2.convert import HF_GEMMA2

import zoo
from zoo.checkpoint.hf_config import HFConfigError
from zoo.nn import DecoderLM
from zoo.nn.blocks import SandwichBlock
from zoo.runtime.slots import SlotBatch

VALUES: dict[str, Any] = {
    "vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 24, "intermediate_size": 96,
    "max_position_embeddings": 64, "query_pre_attn_scalar": 20, "sliding_window": 4,
    "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}  # fmt: skip
OFFICIAL = Path(__file__).parent / "data" / "hub" / "google" / "gemma-2-2b-it" / "config.json"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, DecoderLM, Path]:
    """(transformers' model, zoo's load of its save_pretrained folder, that folder)."""
    folder = tmp_path_factory.mktemp("gemma2")
    torch.manual_seed(0)
    theirs = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**VALUES)).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.1)
    theirs.save_pretrained(folder)
    ours = zoo.load(folder)
    assert isinstance(ours, DecoderLM)
    return theirs, ours, folder


def ids(rows: int = 2, length: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VALUES["vocab_size"], (rows, length), generator=g)


#: Gemma 2 with one seam wrong: either cap dropped, the window one off, every layer sliding
#: or none, the default score scale.
CHANGES: list[dict[str, Any]] = [
    {"attn_softcap": None}, {"final_softcap": None}, {"sliding_window": 3},
    {"sliding_window": 5}, {"layer_types": None},
    {"layer_types": None, "sliding_window": None}, {"attn_scale": None},
]  # fmt: skip


def test_logits_match_and_every_seam_moves_them(pair: tuple[Any, DecoderLM, Path]) -> None:
    """Exact on a left-padded batch; a model with either cap dropped, the window one off,
    every layer sliding or none, or the default score scale is far from transformers."""
    theirs, ours, _ = pair
    x = ids()
    mask = torch.ones_like(x)
    mask[1, :5] = 0
    assert max_logit_diff(ours, theirs, x, mask) <= 1e-5
    with torch.no_grad():
        want = theirs(x).logits
        for change in CHANGES:
            other = DecoderLM(ours.config.replace(**change)).eval()
            other.load_state_dict(ours.state_dict())
            assert float((other(x) - want).abs().max()) > 3e-2, change


def _slot_batch_greedy(model: DecoderLM, prompts: list[torch.Tensor], new: int) -> list[list[int]]:
    batch: SlotBatch[int] = SlotBatch(model, max_rows=len(prompts), max_len=32)
    tokens = [[int(batch.add(r, p).argmax())] for r, p in enumerate(prompts)]
    for _ in range(new - 1):
        logits = batch.step(torch.tensor([row[-1] for row in tokens]))
        for row, chosen in zip(tokens, logits.argmax(-1).tolist(), strict=True):
            row.append(chosen)
    return tokens


def test_greedy_tokens_equal_transformers_and_the_slot_batch(
    pair: tuple[Any, DecoderLM, Path],
) -> None:
    """zoo.generate gives transformers' greedy tokens (prompt longer than the window); the
    serving slot batch, two rows at their own positions, gives each row's tokens alone."""
    theirs, ours, _ = pair
    prompts = [ids(1, 9, seed=3)[0], ids(1, 5, seed=4)[0]]
    alone = []
    for prompt in prompts:
        want = theirs.generate(prompt[None], max_new_tokens=10, min_new_tokens=10, do_sample=False)
        got = zoo.generate(ours, prompt[None], max_new_tokens=10, temperature=0)
        assert torch.equal(got, want)
        alone.append(got[0, len(prompt) :].tolist())
    with torch.no_grad():
        assert _slot_batch_greedy(ours, prompts, 10) == alone


def test_a_transformers4_config_json_loads_the_same_model(
    pair: tuple[Any, DecoderLM, Path], tmp_path: Path
) -> None:
    """As the official file spells it (4.42): no layer_types (transformers alternates,
    sliding first), rope_theta at the top level, hidden_act beside hidden_activation,
    cache_implementation; zoo reads the layers transformers does and the same logits."""
    theirs, _, folder = pair
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, tmp_path / name)
    data = json.loads((tmp_path / "config.json").read_text())
    del data["layer_types"], data["use_bidirectional_attention"]
    data["rope_theta"] = data.pop("rope_parameters")["rope_theta"]
    data["torch_dtype"] = data.pop("dtype")
    data.update(hidden_act="gelu_pytorch_tanh", cache_implementation="hybrid")
    (tmp_path / "config.json").write_text(json.dumps(data))
    model = zoo.load(tmp_path)
    assert isinstance(model, DecoderLM)
    expected = transformers.AutoConfig.from_pretrained(tmp_path).layer_types
    assert list(model.config.layer_types or ()) == expected == [
        "sliding_attention", "full_attention", "sliding_attention"]  # fmt: skip
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(x).logits, rtol=0, atol=1e-5)


def test_export_writes_the_integer_scalar_and_the_layers(
    pair: tuple[Any, DecoderLM, Path], tmp_path: Path
) -> None:
    theirs, ours, _ = pair
    zoo.export(ours, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["query_pre_attn_scalar"] == 20 and isinstance(
        written["query_pre_attn_scalar"], int
    )
    assert written["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    back = transformers.Gemma2ForCausalLM.from_pretrained(tmp_path / "ours").eval()
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, theirs(x).logits, rtol=0, atol=1e-6)
    odd = DecoderLM(ours.config.replace(attn_scale=0.3))
    with pytest.raises(zoo.CheckpointError, match="query_pre_attn_scalar"):
        zoo.export(odd, tmp_path / "odd")


REFUSED = [
    ("hidden_activation", {"hidden_activation": "gelu"}),
    ("attention_bias", {"attention_bias": True}),
    ("use_bidirectional_attention", {"use_bidirectional_attention": True}),
    ("rope_scaling", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("query_pre_attn_scalar", {"query_pre_attn_scalar": 256.5}),
    ("attn_logit_softcapping", {"attn_logit_softcapping": "50"}),
    ("final_logit_softcapping", {"final_logit_softcapping": -30.0}),
    ("layer_types", {"layer_types": ["chunked_attention"] * 26}),
    ("layer_types", {"layer_types": ["full_attention"] * 3}),
    ("num_key_value_heads", {"num_key_value_heads": None}),
    ("rope_local_base_freq", {"rope_local_base_freq": 10000.0}),  # Gemma 3's, not Gemma 2's
]  # fmt: skip


@pytest.mark.parametrize(
    ("key", "change"), REFUSED, ids=[f"{k}-{i}" for i, (k, _) in enumerate(REFUSED)]
)
def test_keys_zoo_cannot_honour_are_refused_by_name(key: str, change: dict[str, Any]) -> None:
    layout = zoo.get_registry().architecture("gemma2").checkpoint_layout("hf-gemma2")
    official = json.loads(OFFICIAL.read_text())
    layout.config_from_foreign(official)  # the file as published reads
    with pytest.raises(HFConfigError, match=key):
        layout.config_from_foreign({**official, **change})


def test_the_named_model_builds_on_meta_at_full_size() -> None:
    model = zoo.build("gemma-2-2b-it", device="meta")
    assert isinstance(model, DecoderLM)
    assert sum(p.numel() for p in model.parameters()) == 2_614_341_888  # Gemma 2 2B
    c = model.config
    assert model.layer_windows == (4096, None) * 13
    assert (c.attn_scale, c.attn_softcap, c.final_softcap, c.head_size) == (0.0625, 50.0, 30.0, 256)
    assert all(isinstance(block, SandwichBlock) for block in model.blocks)
    assert model.head.weight is model.tok_emb.weight


# -- the kit: zoo check's reference check, with and without planted bugs ---------------------


#: The planted bug: Llama's reading of ``post_attention_layernorm`` (the norm before the
#: feed-forward there, after attention in Gemma 2), swapped both ways. It is its own inverse,
#: so a round trip zoo -> Hugging Face -> zoo returns every tensor to its place.
_SWAPPED = dataclasses.replace(
    HF_GEMMA2,
    rules=swap_foreign(HF_GEMMA2.rules, "post_attention_layernorm", "pre_feedforward_layernorm"),
)
#: The other planted bug: the right keys read into a norm of the wrong formula (x * w, not
#: x * (1 + w)).
_PLAIN = dataclasses.replace(HF_GEMMA2, represents={**HF_GEMMA2.represents, "norm": "rmsnorm"})
_PLANTED = Planted("gemma-2-2b-it", {"gemma2-swapped": ("hf-gemma2", _SWAPPED),
                                     "gemma2-plain-norm": ("hf-gemma2", _PLAIN,
                                                           {"norm": "rmsnorm"})})  # fmt: skip


def test_the_kit_catches_the_planted_bugs_the_round_trip_passes(use_registry: Any) -> None:
    """The reference check fails each planted bug (tests/test_conformance.py runs it on
    gemma-2-2b-it itself, against Gemma2ForCausalLM: it passes, logits 0 apart)."""
    from zoo.plugin.current import load_registry
    from zoo.testing import run_check

    use_registry(load_registry(plugins={"planted": _PLANTED}))
    run_check("gemma2-swapped-tiny", "checkpoint_layouts")  # the round trip cannot see it
    for name in ("gemma2-swapped-tiny", "gemma2-plain-norm-tiny"):
        with pytest.raises(AssertionError, match="logits differ"):
            run_check(name, "reference")


def test_the_planted_layout_only_swaps_two_norms() -> None:
    real = {r.zoo: r.foreign for r in HF_GEMMA2.rules}
    planted = {r.zoo: r.foreign for r in _SWAPPED.rules}
    assert {k for k in real if real[k] != planted[k]} == {
        "blocks.{i}.attn_post_norm.weight", "blocks.{i}.ffn_norm.weight"}  # fmt: skip
    assert planted["blocks.{i}.ffn_norm.weight"] == real["blocks.{i}.attn_post_norm.weight"]


# -- the chat template ------------------------------------------------------------------------

#: gemma-2-2b-it's ``chat_template`` (its tokenizer_config.json at 299a8560, which zoo fetches
#: with the tokenizer); the text reproduces the sha256 a public project records for it.
TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
    "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
    "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}"
)


def test_the_chat_template_renders_as_transformers() -> None:
    """Roles mapped (assistant -> model), contents trimmed, the generation prompt; a system
    message or roles out of turn refused, as the template's raise_exception says."""
    import hashlib

    from transformers.utils.chat_template_utils import render_jinja_template

    from zoo.tokenizers.chat import ChatTemplate, ChatTemplateError

    digest = "ecd6ae513fe103f0eb62e8ab5bfa8d0fe45c1074fa398b089c93a7e70c15cfd6"
    assert hashlib.sha256(TEMPLATE.encode()).hexdigest() == digest
    tokens = {"bos_token": "<bos>", "eos_token": "<eos>"}
    ours = ChatTemplate({"default": TEMPLATE}, tokens)
    chat = [{"role": "user", "content": " Hi \n"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Why?"}]  # fmt: skip
    for prompt in (True, False):
        (want,), _ = render_jinja_template(
            conversations=[chat], chat_template=TEMPLATE, add_generation_prompt=prompt, **tokens
        )
        assert ours.render(chat, add_generation_prompt=prompt) == want
    assert want.startswith("<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")
    for bad in ([{"role": "system", "content": "x"}], chat[1:]):
        with pytest.raises(ChatTemplateError, match=r"System role|alternate"):
            ours.render(bad)
