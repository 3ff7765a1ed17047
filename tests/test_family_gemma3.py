"""Gemma 3 text beyond tests/test_families.py's entry, against transformers' own
``Gemma3ForCausalLM``: three layers (sliding, global, sliding) with a window shorter than the
prompt, rotary bases 100 (sliding) and 10,000 (global), scores scaled by
``query_pre_attn_scalar = 16`` apart from the heads' 24 features, and a final logit cap.
Every decoding path (dynamic session, the fixed-shape step that ``compile=True`` compiles,
the serving slot batch, a left-padded batch, greedy generation) gives transformers' logits;
transformers 4.x's spelling (``rope_local_base_freq``, ``sliding_window_pattern``) loads the
same model; what zoo cannot honour is refused by name; the named model is the official one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from parity import max_logit_diff
from planted import Planted, swap_foreign
from zoo_plugins.gemma3.convert import GEMMA3_CONFIG, HF_GEMMA3, read_gemma3, write_gemma3

import zoo
from zoo.nn import DecoderLM
from zoo.runtime.decoding import DecoderSession, StaticDecoderSession
from zoo.runtime.slots import SlotBatch

LAYERS = ["sliding_attention", "full_attention", "sliding_attention"]
VALUES = {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
          "intermediate_size": 96, "max_position_embeddings": 64, "query_pre_attn_scalar": 16,
          "sliding_window": 4, "layer_types": LAYERS, "rope_theta": 10000.0,
          "rope_local_base_freq": 100.0, "final_logit_softcapping": 0.5}  # fmt: skip
PROMPT = [5, 17, 3, 44, 9, 61, 2, 30, 120, 77, 250, 13]  # three windows long
FORCED = [7, 12, 90, 4, 55, 8]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """transformers' Gemma 3 with random weights (norms too), saved once for the module."""
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**VALUES, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # (1 + w) norms start at w = 0: make them count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    path = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def theirs(folder: Path) -> transformers.Gemma3ForCausalLM:
    return transformers.Gemma3ForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def ours(folder: Path) -> DecoderLM:
    model = zoo.load(folder)
    assert isinstance(model, DecoderLM)
    return model


def their_next_logits(theirs: Any, ids: list[int], forced: list[int]) -> torch.Tensor:
    """transformers' next-token logits after the prompt and each forced token, ``(N, V)``."""
    with torch.no_grad():
        logits = theirs(torch.tensor([ids + forced])).logits[0]
    return logits[len(ids) - 1 : len(ids) + len(forced) - 1]


def test_the_config_reads_every_gemma3_setting(ours: DecoderLM) -> None:
    c = ours.config
    assert type(c).architecture == "gemma3"
    assert c.layer_types == tuple(LAYERS) and c.sliding_window == 4
    assert (c.rope_theta, c.rope_local_theta) == (10000.0, 100.0)
    assert c.attn_scale == 0.25 and c.head_size == 24 and c.final_softcap == 0.5
    assert ours.layer_windows == (4, None, 4)


def test_logits_equal_transformers_on_a_padded_batch(ours: DecoderLM, theirs: Any) -> None:
    ids = torch.tensor([PROMPT + FORCED, PROMPT + FORCED, PROMPT + FORCED])
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # left padding
    mask[2, 14:] = 0  # right padding
    assert max_logit_diff(ours, theirs, ids, mask) <= 1e-5


def test_each_setting_moves_the_logits(ours: DecoderLM, theirs: Any) -> None:
    """The comparisons can fail: a model reading any one setting wrongly (the sliding layers'
    rotary base, the global one, which layers slide, the window, the score scale, the cap)
    is far from transformers."""
    ids = torch.tensor([PROMPT + FORCED])
    with torch.no_grad():
        want = theirs(ids).logits
    for change in ({"rope_local_theta": 10000.0}, {"rope_theta": 100.0}, {"layer_types": None},
                   {"sliding_window": None, "layer_types": None}, {"attn_scale": None},
                   {"final_softcap": None}):  # fmt: skip
        other = copy.deepcopy(ours)
        other.__init__(ours.config.replace(**change))  # type: ignore[misc]
        other.load_state_dict(ours.state_dict())
        with torch.no_grad():
            assert float((other.eval()(ids) - want).abs().max()) > 1e-2, change


def test_every_decoding_path_gives_transformers_logits(ours: DecoderLM, theirs: Any) -> None:
    """The dynamic session, the fixed-shape step (what CUDA graphs record and compile=True
    compiles) and the serving slot batch (beside a row at another position), each past the
    window, give the next-token logits transformers computes for the whole sequence."""
    want = their_next_logits(theirs, PROMPT, FORCED)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        for session in (DecoderSession(ours, ids, None, 24),
                        StaticDecoderSession(ours, ids, None, 24, record=False)):  # fmt: skip
            got = [session.prefill()[0]]
            got += [session.step(torch.tensor([t]))[0] for t in FORCED[:-1]]
            torch.testing.assert_close(torch.stack(got), want, rtol=0, atol=1e-5)
        batch: SlotBatch[str] = SlotBatch(ours, max_rows=2, max_len=24)
        batch.add("other", torch.tensor([8, 1, 2, 200, 31]))
        got = [batch.add("row", torch.tensor(PROMPT))]
        got += [batch.step(torch.tensor([3, t]))[1] for t in FORCED[:-1]]
        torch.testing.assert_close(torch.stack(got), want, rtol=0, atol=1e-5)


def test_a_left_padded_batch_gives_each_rows_transformers_logits(
    ours: DecoderLM, theirs: Any
) -> None:
    short = PROMPT[:5]
    ids = torch.tensor([PROMPT, [0] * (len(PROMPT) - len(short)) + short])
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[1, : len(PROMPT) - len(short)] = False
    with torch.no_grad():
        for static in (False, True):
            session = (StaticDecoderSession(ours, ids, keep, 24, record=False) if static
                       else DecoderSession(ours, ids, keep, 24))  # fmt: skip
            got = [session.prefill()]
            got += [session.step(torch.tensor([t, t])) for t in FORCED[:3]]
            for row, prompt in enumerate((PROMPT, short)):
                want = their_next_logits(theirs, prompt, FORCED[:4])
                mine = torch.stack([g[row] for g in got])
                torch.testing.assert_close(mine, want, rtol=0, atol=1e-5)


def test_greedy_decoding_equals_transformers_generate(ours: DecoderLM, theirs: Any) -> None:
    """(``compile=True`` against eager on Gemma 3: tests/test_families.py's compiled case.)"""
    prompt = torch.tensor([PROMPT])
    want = theirs.generate(prompt, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert torch.equal(zoo.generate(ours, prompt, max_new_tokens=10, temperature=0), want)


# -- config.json: both spellings; what zoo cannot honour is refused by name ----------------


def _copy_with(folder: Path, tmp_path: Path, change: Callable[[dict], Any]) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    data = json.loads((target / "config.json").read_text())
    change(data)
    (target / "config.json").write_text(json.dumps(data))
    return target


def _as_transformers4(data: dict) -> None:
    """The spelling of the official 4.50 files: top-level bases, a pattern, no layer list."""
    rope = data.pop("rope_parameters")
    del data["layer_types"], data["_sliding_window_pattern"]
    data.update(rope_theta=rope["full_attention"]["rope_theta"], rope_scaling=None,
                rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
                sliding_window_pattern=2, cache_implementation="hybrid")  # fmt: skip


def test_the_transformers4_spelling_loads_the_same_model(
    folder: Path, ours: DecoderLM, tmp_path: Path
) -> None:
    old = _copy_with(folder, tmp_path, _as_transformers4)
    assert transformers.AutoConfig.from_pretrained(old).layer_types == LAYERS
    again = zoo.load(old)
    assert again.config == ours.config
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_the_export_writes_transformers5_spelling(ours: DecoderLM, tmp_path: Path) -> None:
    zoo.export(ours, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "config.json").read_text())
    assert data["layer_types"] == LAYERS and data["query_pre_attn_scalar"] == 16
    assert data["rope_parameters"] == {
        "full_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_attention": {"rope_theta": 100.0, "rope_type": "default"},
    }
    back = transformers.AutoConfig.from_pretrained(tmp_path / "out")
    assert back.rope_parameters["sliding_attention"]["rope_theta"] == 100.0
    odd = copy.deepcopy(ours)
    odd.config = ours.config.replace(attn_scale=0.3)  # no integer s has s ** -0.5 = 0.3
    with pytest.raises(zoo.CheckpointError, match="query_pre_attn_scalar"):
        zoo.export(odd, tmp_path / "odd")


REFUSED = [
    ("rope_scaling", lambda d: d.update(rope_scaling={"rope_type": "linear", "factor": 8.0})),
    (r"rope_parameters\.full_attention\.rope_type = 'linear'",
     lambda d: d["rope_parameters"]["full_attention"].update(rope_type="linear", factor=8.0)),
    (r"rope_parameters has rope_theta",
     lambda d: d["rope_parameters"].update(rope_theta=5.0, rope_type="default")),
    ("rope_local_base_freq = 5.0 and rope_parameters.sliding_attention.rope_theta",
     lambda d: d.update(rope_local_base_freq=5.0)),
    ("attn_logit_softcapping", lambda d: d.update(attn_logit_softcapping=50.0)),
    ("use_bidirectional_attention", lambda d: d.update(use_bidirectional_attention=True)),
    ("hidden_activation", lambda d: d.update(hidden_activation="gelu")),
    ("sliding_window_pattern", lambda d: d.update(sliding_window_pattern=0)),
    ("layer_types", lambda d: d.update(layer_types=LAYERS[:2])),
]  # fmt: skip


@pytest.mark.parametrize(("key", "change"), REFUSED, ids=[k[:24] for k, _ in REFUSED])
def test_keys_zoo_cannot_honour_are_refused_by_name(
    folder: Path, tmp_path: Path, key: str, change: Callable[[dict], Any]
) -> None:
    with pytest.raises(zoo.ZooError, match=key):
        zoo.load(_copy_with(folder, tmp_path, change))


# -- the named model -------------------------------------------------------------------------

OFFICIAL = Path(__file__).parent / "data" / "hub" / "google" / "gemma-3-1b-it"


def test_gemma_3_1b_builds_on_meta_at_full_size() -> None:
    """999,885,952 parameters (the count public ports of the official weights report), every
    sixth layer global with base 1e6, the others a 512-token window with base 1e4, as
    transformers reads the official config.json (which lists no layer_types)."""
    model = zoo.build("gemma-3-1b-it", device="meta")
    assert sum(p.numel() for p in model.parameters()) == 999_885_952
    official = transformers.AutoConfig.from_pretrained(OFFICIAL)
    kinds = [model.config.layer_type(i) for i in range(model.config.n_layers)]
    assert kinds == official.layer_types
    assert model.layer_windows.count(None) == 4 and set(model.layer_windows) == {512, None}
    thetas = {model.config.layer_rope_theta(i) for i in range(5)}
    assert thetas == {10_000.0} and model.config.layer_rope_theta(5) == 1_000_000.0
    assert model.config.attn_scale == official.query_pre_attn_scalar**-0.5


# -- the kit: zoo check's reference check, with and without planted bugs ---------------------


def _bases_swapped(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "rope_theta": values["rope_local_theta"],
            "rope_local_theta": values["rope_theta"]}  # fmt: skip


#: Planted bug 1: each layer's q_norm read into the keys' norm and k_norm into the queries'
#: (both ways: its own inverse, so zoo -> Hugging Face -> zoo returns every tensor).
_QK_SWAPPED = dataclasses.replace(
    HF_GEMMA3, rules=swap_foreign(HF_GEMMA3.rules, ".q_norm.", ".k_norm.")
)
#: Planted bug 2: the global base read as the sliding layers' and back (config.json, both ways).
_BASES = dataclasses.replace(
    GEMMA3_CONFIG,
    read_extra=lambda r: _bases_swapped(read_gemma3(r)),
    write_extra=lambda c: write_gemma3(
        c.replace(rope_theta=c.rope_local_theta, rope_local_theta=c.rope_theta)
    ),
)
_BASES_SWAPPED = dataclasses.replace(
    HF_GEMMA3, config_from_foreign=_BASES.read, config_to_foreign=_BASES.write
)


_PLANTED = Planted(
    "gemma-3-1b-it",
    {
        "gemma3-qk-swapped": ("hf-gemma3", _QK_SWAPPED),
        "gemma3-bases-swapped": ("hf-gemma3", _BASES_SWAPPED),
    },
)


def test_the_kit_catches_the_planted_bugs_the_round_trip_passes(use_registry: Any) -> None:
    """``zoo check``'s reference check fails both planted bugs, which its round trip passes
    (tests/test_conformance.py runs it on gemma-3-1b-it itself, shrunk, every parameter
    random, against Gemma3ForCausalLM: it passes, logits 4.3e-06 apart, greedy tokens equal)."""
    from zoo.plugin.current import load_registry
    from zoo.testing import run_check

    use_registry(load_registry(plugins={"planted": _PLANTED}))
    for name in _PLANTED.variants:
        run_check(f"{name}-tiny", "checkpoint_layouts")  # the round trip cannot see it
        with pytest.raises(AssertionError, match="logits differ"):
            run_check(f"{name}-tiny", "reference")


# -- the chat template ------------------------------------------------------------------------

#: gemma-3-1b-it's ``chat_template`` (its tokenizer_config.json at dcc83ea8, which zoo fetches
#: with the tokenizer): the text a public copy of the repo's template holds, whose sha256 is
#: the one a public project records for that revision's template.
TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n"
    "\n"
    "' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n"
    "\n"
    "' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate '
    'user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n"
    '\' + (first_user_prefix if loop.first else "") }}\n'
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n"
    "' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n"
    "'}}\n"
    "{%- endif -%}\n"
)


def test_the_chat_template_renders_as_transformers() -> None:
    """A system message becomes the first user turn's prefix, assistant is "model", contents
    are trimmed (text items of a list too, an image item its marker), the generation prompt;
    roles out of turn and a content of another type refused, as raise_exception says."""
    import hashlib

    from transformers.utils.chat_template_utils import render_jinja_template

    from zoo.tokenizers.chat import ChatTemplate, ChatTemplateError

    digest = "7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4"
    assert hashlib.sha256(TEMPLATE.encode()).hexdigest() == digest
    tokens = {"bos_token": "<bos>", "eos_token": "<eos>"}
    ours = ChatTemplate({"default": TEMPLATE}, tokens)
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " Hi \n"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Why? "}]},
    ]
    for prompt in (True, False):
        (want,), _ = render_jinja_template(
            conversations=[chat], chat_template=TEMPLATE, add_generation_prompt=prompt, **tokens
        )
        assert ours.render(chat, add_generation_prompt=prompt) == want
    assert want.startswith("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n")
    assert "<start_of_turn>model\nHello!<end_of_turn>\n" in want
    assert want.endswith("<start_of_turn>user\n<start_of_image>Why?<end_of_turn>\n")
    for bad in (chat[2:], [{"role": "user", "content": 3}]):
        with pytest.raises(ChatTemplateError, match=r"alternate|Invalid content type"):
            ours.render(bad)
