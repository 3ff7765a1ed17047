"""Layout helpers a family declares its Hugging Face checkpoint with:
``hf_layout``'s whole-state transforms and ignored keys, a config field converted when read
(``HFField(read=, write=)``), and the special token ids every export writes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch import Tensor
from zoo_plugins.llama.config import LlamaConfig
from zoo_plugins.llama.convert import LLAMA_CONFIG

import zoo
from zoo.checkpoint.hf_config import HFConfigError, HFConfigFormat, HFField
from zoo.checkpoint.hf_layout import hf_layout
from zoo.checkpoint.hf_rules import DOWN, GATE_UP, llama_qkv, llama_rules

TINY = dict(vocab_size=300, context_length=64, d_model=64, n_heads=4, n_kv_heads=2,
            n_layers=2, d_ff=96)  # fmt: skip


@pytest.fixture(scope="module")
def tiny() -> Any:
    torch.manual_seed(0)
    return zoo.build(LlamaConfig(**TINY)).eval()


# -- hf_layout: transforms and ignored keys ---------------------------------------------------
def _shift(delta: float):  # type: ignore[no-untyped-def]
    def shift(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
        assert isinstance(config, LlamaConfig)  # the transforms receive the model's config
        return {k: v + delta if k.endswith("norm.weight") else v for k, v in state.items()}

    return shift


def test_hf_layout_runs_its_transforms_and_ignores_what_it_is_told(tiny: Any) -> None:
    """A foreign layout storing each norm's weight minus one (as Gemma's ``(1 + w)`` files
    do): ``merge_foreign`` adds one on import, ``split_foreign`` takes it off on export, and
    the keys named in ``ignore_foreign`` / ``ignore_zoo`` are neither placed nor reported."""
    layout = hf_layout(
        LLAMA_CONFIG, (*llama_rules(), DOWN), fused=(*llama_qkv(), *GATE_UP),
        merge_foreign=_shift(1.0), split_foreign=_shift(-1.0),
        ignore_foreign=(r"model\.layers\.\d+\.extra_buffer",), ignore_zoo=(r"scratch\..*",),
        strip_prefixes=("base.",),
    )  # fmt: skip
    state = {**tiny.state_dict(), "scratch.table": torch.zeros(3)}
    foreign, report = layout.from_zoo(state, tiny.config)
    assert report.unexpected == () and report.missing == ()
    zoo_norm = tiny.state_dict()["blocks.0.attn_norm.weight"]
    torch.testing.assert_close(foreign["model.layers.0.input_layernorm.weight"], zoo_norm - 1)
    torch.testing.assert_close(foreign["model.norm.weight"], tiny.final_norm.weight - 1)
    # a prefixed file with a buffer the model does not use: both handled
    prefixed = {f"base.{k}": v for k, v in foreign.items()}
    prefixed["base.model.layers.1.extra_buffer"] = torch.ones(2)
    back, report = layout.to_zoo(prefixed, tiny.config)
    assert report.unexpected == ()
    assert set(back) == set(tiny.state_dict())
    for key, value in tiny.state_dict().items():
        torch.testing.assert_close(back[key], value, rtol=0, atol=0, msg=key)


# -- HFField(read=, write=) ---------------------------------------------------------------------
SCALE = HFConfigFormat(
    family="Scaled", model_type="llama", architecture="LlamaForCausalLM", config=LlamaConfig,
    fields={**LLAMA_CONFIG.fields, "attn_scale": HFField(
        "query_pre_attn_scalar", 256, read=lambda s: s**-0.5, write=lambda c: c.attn_scale**-2,
    )},
    fixed=LLAMA_CONFIG.fixed,
)  # fmt: skip
FILE = {"model_type": "llama", "vocab_size": 300, "max_position_embeddings": 64,
        "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 96}  # fmt: skip


def test_a_field_is_converted_when_read_and_back_when_written() -> None:
    assert SCALE.read({**FILE, "query_pre_attn_scalar": 64})["attn_scale"] == 0.125
    assert SCALE.read(FILE)["attn_scale"] == 1 / 16  # the default, as the file spells it
    assert SCALE.read({**FILE, "query_pre_attn_scalar": None})["attn_scale"] == 1 / 16
    config = LlamaConfig(**TINY, attn_scale=0.125)
    assert SCALE.write(config)["query_pre_attn_scalar"] == 64


def test_a_conversion_that_fails_names_the_key() -> None:
    with pytest.raises(HFConfigError, match=r"query_pre_attn_scalar = 0 cannot be read"):
        SCALE.read({**FILE, "query_pre_attn_scalar": 0})  # 0 ** -0.5: ZeroDivisionError
    with pytest.raises(HFConfigError, match=r"config: query_pre_attn_scalar must be float"):
        SCALE.read({**FILE, "query_pre_attn_scalar": -4})  # (-4) ** -0.5 is complex
    with pytest.raises(ValueError, match="write= must give it back"):
        HFField("query_pre_attn_scalar", read=float)


# -- special token ids on export ----------------------------------------------------------------
def _word_tokenizer(vocab: int) -> Any:
    """A word-level tokenizer of ``vocab`` ids: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from zoo.tokenizers.hf_backend import HFTokenizer

    words = ["<pad>", "<s>", "</s>", "<unk>", *(f"w{i}" for i in range(vocab - 4))]
    library = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    library.pre_tokenizer = pre_tokenizers.Whitespace()
    library.add_special_tokens(["<pad>", "<s>", "</s>"])
    return HFTokenizer(
        library, name="words", roles={"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    )


def test_an_export_writes_the_special_token_ids(tiny: Any, tmp_path: Path) -> None:
    """Without a tokenizer the three ids are null (never a config class's default, which
    may lie outside a small vocabulary); with one, its own ids. Both load in transformers."""
    ids = torch.randint(0, TINY["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = tiny(ids)
    zoo.export(tiny, tmp_path / "bare")
    written = json.loads((tmp_path / "bare" / "config.json").read_text())
    keys = ("pad_token_id", "bos_token_id", "eos_token_id")
    assert {k: written[k] for k in keys} == dict.fromkeys(keys)
    tiny.tokenizer = _word_tokenizer(TINY["vocab_size"])
    try:
        zoo.export(tiny, tmp_path / "words")
    finally:
        tiny.tokenizer = None
    written = json.loads((tmp_path / "words" / "config.json").read_text())
    assert (written["pad_token_id"], written["bos_token_id"], written["eos_token_id"]) == (0, 1, 2)
    for folder in ("bare", "words"):
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / folder).eval()
        assert theirs.config.pad_token_id == (0 if folder == "words" else None)
        with torch.no_grad():
            torch.testing.assert_close(theirs(ids).logits, want, rtol=1e-5, atol=1e-5)


# -- partial rotary: a count, read and written as transformers computes it --------------------
NEOX = {
    "model_type": "gpt_neox",
    "vocab_size": 300,
    "max_position_embeddings": 64,
    "hidden_size": 96,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
}  # fmt: skip  (heads 48 wide)


def test_a_fraction_is_written_so_that_transformers_turns_the_same_count() -> None:
    """Every even count of every head size up to 128 (and 160, 192, 256), written as
    ``rotary_pct`` through JSON, comes back under transformers' ``int(head_dim *
    partial_rotary_factor)`` (modeling_rope_utils; GPT-NeoX's ``rotary_ndims``)."""
    from types import SimpleNamespace

    from zoo_plugins.gpt_neox.convert import NEOX_CONFIG

    fields = {field: 1 for field in NEOX_CONFIG.fields}
    wrong = []
    for head in (*range(2, 129), 160, 192, 256):
        for count in (*range(2, head, 2), None):
            stand_in = SimpleNamespace(**{**fields, "head_size": head, "rotary_dim": count})
            written = json.loads(json.dumps(NEOX_CONFIG.write(stand_in)))["rotary_pct"]
            if int(head * written) != (count or head) or not 0 < written <= 1:
                wrong.append((head, count, written))
    assert wrong == []


@pytest.mark.parametrize(("head", "count"), [(48, 14), (44, 30), (80, 32), (96, 26), (100, 2)])
def test_transformers_reads_the_count_zoo_writes(head: int, count: int) -> None:
    """The whole way: zoo's config -> config.json -> transformers' own config and rotary
    initialisation -> as many inverse frequencies as ``count / 2``; and zoo reads it back."""
    from zoo_plugins.gpt_neox.config import GPTNeoXConfig
    from zoo_plugins.gpt_neox.convert import NEOX_CONFIG

    config = GPTNeoXConfig(vocab_size=300, context_length=64, d_model=2 * head, n_heads=2,
                           n_layers=1, d_ff=64, rotary_dim=count)  # fmt: skip
    written = json.loads(json.dumps(NEOX_CONFIG.write(config)))
    theirs = transformers.GPTNeoXConfig(**written)
    inv_freq, _ = transformers.models.gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding(
        theirs
    ).compute_default_rope_parameters(theirs)
    assert 2 * len(inv_freq) == count
    assert NEOX_CONFIG.read(written)["rotary_dim"] == count


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rotary_pct": 0.33}, r"rotary_pct = 0\.33 gives int\(48 \* 0\.33\) = 15 rotary"),
        (
            {"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.33}},
            r"rope_parameters\.partial_rotary_factor = 0\.33 gives int\(48 \* 0\.33\) = 15",
        ),
        ({"rotary_pct": 0.02}, r"rotary_pct = 0\.02 gives int\(48 \* 0\.02\) = 0 rotary"),
        ({"rotary_pct": 1.5}, r"rotary_pct = 1\.5 must be a number in \(0, 1\]"),
    ],
)
def test_a_count_zoo_cannot_turn_is_refused_naming_the_key(
    change: dict[str, Any], message: str
) -> None:
    """Before: GPT-NeoX head 48, rotary_pct 0.33 (transformers turns 15) loaded turning 14,
    0.007 apart, with no error."""
    from zoo_plugins.gpt_neox.convert import NEOX_CONFIG

    with pytest.raises(HFConfigError, match=message):
        NEOX_CONFIG.read({**NEOX, **change})


def test_gpt_neox_with_partial_rotary_loads_exactly(tmp_path: Path) -> None:
    """transformers' GPT-NeoX, heads 48 wide turning 14 features (rotary_pct 0.3: not a
    power of two, not a quarter): zoo's logits equal transformers', and its export loads
    back into transformers turning 14."""
    torch.manual_seed(0)
    config = {k: v for k, v in NEOX.items() if k != "model_type"}
    theirs = transformers.GPTNeoXForCausalLM(
        transformers.GPTNeoXConfig(**config, rotary_pct=0.3)
    ).eval()
    theirs.save_pretrained(tmp_path / "theirs")
    ours = zoo.load(tmp_path / "theirs")
    assert ours.config.rotary_dim == 14
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = theirs(ids).logits
        torch.testing.assert_close(ours(ids), want, rtol=0, atol=1e-5)
    zoo.export(ours, tmp_path / "ours")
    back = transformers.GPTNeoXForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert back.gpt_neox.layers[0].attention.rotary_ndims == 14
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, want, rtol=0, atol=1e-5)


def test_a_count_key_reads_and_writes_the_count() -> None:
    """GPT-J's spelling: ``rotary_dim`` is the count itself. Before (a fraction in zoo):
    head 44 with rotary_dim 30 loaded turning 28 and exported 28."""
    from zoo_plugins.gpt_neox.config import GPTNeoXConfig
    from zoo_plugins.gpt_neox.convert import NEOX_CONFIG

    gptj_like = dataclasses.replace(
        NEOX_CONFIG, fields={**NEOX_CONFIG.fields, "rotary_dim": HFField("rotary_dim")}
    )
    file = {**NEOX, "hidden_size": 88}  # heads 44 wide
    assert gptj_like.read({**file, "rotary_dim": 30})["rotary_dim"] == 30
    assert gptj_like.read({**file, "rotary_dim": None})["rotary_dim"] is None
    assert gptj_like.read({**file, "rotary_dim": 44})["rotary_dim"] is None  # all of them
    config = GPTNeoXConfig(vocab_size=300, context_length=64, d_model=88, n_heads=2,
                           n_layers=2, d_ff=128, rotary_dim=30)  # fmt: skip
    assert gptj_like.write(config)["rotary_dim"] == 30
    for count in (31, 46, 0, -2):
        with pytest.raises(HFConfigError, match=rf"rotary_dim = {count} asks for {count} rot"):
            gptj_like.read({**file, "rotary_dim": count})
    with pytest.raises(HFConfigError, match=r"rotary_dim = 30\.0 must be an integer"):
        gptj_like.read({**file, "rotary_dim": 30.0})


def test_an_old_checkpoint_with_rotary_fraction_still_loads(tmp_path: Path) -> None:
    """A zoo checkpoint saved before ``rotary_dim`` (its config says ``rotary_fraction``
    0.25 and lacks the fields added since): heads 64 wide turn 16, the same logits."""
    from zoo_plugins.gpt_neox.config import GPTNeoXConfig

    torch.manual_seed(0)
    model = zoo.build(GPTNeoXConfig(vocab_size=300, context_length=64, d_model=128, n_heads=2,
                                    n_layers=2, d_ff=128, rotary_dim=16)).eval()  # fmt: skip
    zoo.save(model, tmp_path)
    manifest = json.loads((tmp_path / "config.json").read_text())
    added = ("block", "layer_types", "rope_local_theta", "rotary_dim", "attn_scale",
             "attn_softcap", "final_softcap", "logit_scale", "attn_out_bias", "mlp_bias",
             "norm_bias", "qk_norm_scope")  # fmt: skip
    manifest["config"] = {k: v for k, v in manifest["config"].items() if k not in added}
    manifest["config"]["rotary_fraction"] = 0.25
    (tmp_path / "config.json").write_text(json.dumps(manifest))
    old = zoo.load(tmp_path)
    assert old.config.rotary_dim == 16
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(old(ids), model(ids), rtol=0, atol=0)
