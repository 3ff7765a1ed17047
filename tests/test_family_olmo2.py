"""OLMo-2 beyond its ``FAMILIES`` entry (tests/test_families.py: grouped-query attention, 4
query heads over 2 key/value heads, so ``k_norm`` is half as wide as ``q_norm``): a second
geometry against transformers' ``Olmo2ForCausalLM`` (multi-query attention, heads of 24 apart
from the width, tied embeddings, the official file's transformers 4.x spelling and no
``rms_norm_eps``: transformers' default 1e-5), the keys zoo cannot honour refused by name, the
named model at full size, its chat template rendered as transformers renders it, and the
conformance kit's ``reference`` check with and without a planted bug.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from chat_folders import CONTROL, PLAIN, library_tokenizer, token_id
from parity import max_logit_diff, padded_batch
from planted import Planted, swap_foreign
from zoo_plugins.olmo2 import REPO, REVISION
from zoo_plugins.olmo2.convert import HF_OLMO2

import zoo
from zoo.checkpoint.hf_config import HFConfigError

HUB = Path(__file__).parent / "data" / "hub" / REPO

#: Multi-query attention, heads of 24 apart from the width 64 (q_norm over 96 features,
#: k_norm over 24), tied embeddings, rotary base 5e5; saved, then rewritten as the official
#: file spells it (transformers 4.x) without rms_norm_eps.
SECOND = {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 24,
          "intermediate_size": 96, "max_position_embeddings": 128, "tie_word_embeddings": True,
          "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}  # fmt: skip


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """transformers' OLMo-2 of the second geometry, random (norms too), saved once."""
    folder = tmp_path_factory.mktemp("olmo2-second")
    torch.manual_seed(0)
    config = transformers.Olmo2Config(**SECOND, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.Olmo2ForCausalLM(config).eval()
    with torch.no_grad():  # transformers initialises norms to 1: make them count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)
    model.save_pretrained(folder)
    data = json.loads((folder / "config.json").read_text())
    rope = data.pop("rope_parameters")  # as the official file: 4.x keys, no epsilon
    del data["rms_norm_eps"]
    data.update(rope_theta=rope["rope_theta"], rope_scaling=None, torch_dtype=data.pop("dtype"),
                transformers_version="4.50.0", use_cache=False)  # fmt: skip
    (folder / "config.json").write_text(json.dumps(data))
    return model, folder


def test_a_second_geometry_matches_transformers(second, tmp_path: Path) -> None:
    reference, folder = second
    model = zoo.load(folder)
    config = model.config
    assert (config.n_kv_heads, config.head_size, config.layer_norm_eps) == (1, 24, 1e-5)
    assert config.tie_embeddings and config.rope_theta == 500000.0
    attn = model.blocks[0].attn
    assert (attn.q_norm.weight.shape[0], attn.k_norm.weight.shape[0]) == (96, 24)
    diff = max_logit_diff(model, reference, *padded_batch(300))
    print(f"olmo2 second geometry: max |zoo - transformers| = {diff:.2e}")
    assert diff <= 1e-5
    zoo.export(model, tmp_path)  # and back: transformers reads zoo's export as the same model
    back = transformers.Olmo2ForCausalLM.from_pretrained(tmp_path).eval()
    assert max_logit_diff(model, back, *padded_batch(300)) <= 1e-5


def _edited(change: Any) -> dict[str, Any]:
    data = json.loads((HUB / "config.json").read_text())
    change(data)
    return data


REFUSED = [
    ("attention_bias", lambda d: d.update(attention_bias=True)),
    ("hidden_act", lambda d: d.update(hidden_act="gelu")),
    ("rope_scaling", lambda d: d.update(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    ("rope_parameters.rope_type = 'yarn'",
     lambda d: d.update(rope_parameters={"rope_type": "yarn", "rope_theta": 500000})),
    ("sliding_window", lambda d: d.update(sliding_window=4096)),  # OLMo 3's, not OLMo-2's
    ("num_key_value_heads = 3: must divide num_attention_heads",
     lambda d: d.update(num_key_value_heads=3)),
]  # fmt: skip


@pytest.mark.parametrize(("key", "change"), REFUSED, ids=[k.split()[0] for k, _ in REFUSED])
def test_keys_zoo_cannot_honour_are_refused_by_name(key: str, change: Any) -> None:
    """The official config.json, edited: what zoo's OLMo-2 cannot compute is refused, naming
    the key as the file spells it; unedited, it reads (pad_token_id, use_cache are inert)."""
    assert HF_OLMO2.config_from_foreign(_edited(lambda d: None))["d_model"] == 2048
    with pytest.raises(HFConfigError, match=key.replace(".", r"\.").replace("'", "'?")):
        HF_OLMO2.config_from_foreign(_edited(change))


def test_olmo2_1b_builds_on_meta_at_full_size() -> None:
    model = zoo.build("olmo-2-1b-instruct", device="meta")
    assert sum(p.numel() for p in model.parameters()) == 1_484_916_736  # as transformers counts
    block = model.blocks[0]
    assert block.attn_norm is None and block.ffn_norm is None  # no norm before either branch
    widths = block.attn.q_norm.weight.shape[0], block.attn.k_norm.weight.shape[0]
    assert widths == (2048, 2048)  # every head's features, queries and keys (16 of 128)
    assert not model.config.tie_embeddings and model.head.weight.shape == (100352, 2048)


def test_the_tokenizer_is_the_repo_s_at_the_pinned_revision_with_its_chat_template(tmp_path):
    """The named model's tokenizer is the repo's at the revision its weights pin, end ids
    included; the official chat template (vendored tokenizer_config.json) renders as
    transformers renders it, over a byte-level vocabulary with the template's tokens."""
    spec = zoo.get_registry().model("olmo-2-1b-instruct")
    assert spec.weights is not None and spec.weights.revision == REVISION
    pinned = zoo.get_registry().tokenizer(spec.tokenizer).factory
    assert (pinned.repo, pinned.revision) == (spec.weights.repo, REVISION) == (REPO, REVISION)
    assert pinned.extra == ("generation_config.json",)  # the end ids
    official = json.loads((HUB / "tokenizer_config.json").read_text())
    library_tokenizer().save(str(tmp_path / "tokenizer.json"))
    decoder = {str(token_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                  "rstrip": False, "single_word": False, "special": t in CONTROL}
               for t in CONTROL + PLAIN}  # fmt: skip
    config = {**official, "added_tokens_decoder": decoder, "pad_token": "<|endoftext|>",
              "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    end = token_id("<|endoftext|>")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": end}))
    ours = zoo.tokenizer(str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert list(ours.end_ids) == [end]
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "Hi there, ünïcode"}
    assistant = {"role": "assistant", "content": "Hello."}
    for messages in ([user], [system, user], [user, assistant, user], [user, assistant]):
        for gen in (True, False):
            want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == want
    text = ours.apply_chat_template([system, user], add_generation_prompt=True)
    turns = "<|system|>\nBe brief.\n<|user|>\nHi there, ünïcode\n<|assistant|>\n"
    assert text == "<|endoftext|>" + turns  # bos, then the turns: a real rendering


# -- the kit: zoo check's reference check, with and without a planted bug -------------------


#: The planted bug: OLMo-2's two post-branch norms swapped in the layout. It is its own
#: inverse, so a round trip zoo -> Hugging Face -> zoo returns every tensor to its place.
_SWAPPED = dataclasses.replace(
    HF_OLMO2,
    rules=swap_foreign(HF_OLMO2.rules, "post_attention_layernorm", "post_feedforward_layernorm"),
)
_PLANTED = Planted("olmo-2-1b-instruct", {"olmo2-swapped": ("hf-olmo2", _SWAPPED)})


def test_the_kit_proves_olmo2_against_transformers_and_catches_swapped_norms(use_registry):
    from zoo.plugin.current import load_registry
    from zoo.testing import run_check

    note = run_check("olmo-2-1b-instruct", "reference")
    print(note)
    assert note is not None and "Olmo2ForCausalLM" in note and "greedy tokens equal" in note
    real = {r.zoo: r.foreign for r in HF_OLMO2.rules}
    planted = {r.zoo: r.foreign for r in _SWAPPED.rules}
    assert {k for k in real if real[k] != planted[k]} == {
        "blocks.{i}.attn_post_norm.weight",
        "blocks.{i}.ffn_post_norm.weight",
    }
    use_registry(load_registry(plugins={"planted": _PLANTED}))
    run_check("olmo2-swapped-tiny", "checkpoint_layouts")  # the round trip cannot see it
    with pytest.raises(AssertionError, match="logits differ"):
        run_check("olmo2-swapped-tiny", "reference")
