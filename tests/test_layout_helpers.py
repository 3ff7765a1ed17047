"""Layout helpers a family declares its Hugging Face checkpoint with (issue 29, item 6):
``hf_layout``'s whole-state transforms and ignored keys, a config field converted when read
(``HFField(read=, write=)``), and the special token ids every export writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch import Tensor
from zoo_plugins.llama.config import LlamaConfig
from zoo_plugins.llama.convert import DOWN, GATE_UP, LLAMA_CONFIG, llama_qkv, llama_rules

import zoo
from zoo.convert import hf_layout
from zoo.hf_config import HFConfigError, HFConfigFormat, HFField

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
