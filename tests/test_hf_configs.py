"""Hugging Face configs are read exactly or refused: every key that changes the arithmetic is
taken from wherever transformers 4 or 5 writes it, and a key zoo cannot honour is an error
naming it, never ignored."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers

import zoo
from zoo.errors import CheckpointError

TINY_LLAMA = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    rms_norm_eps=1e-5, tie_word_embeddings=False,
)  # fmt: skip


def _llama(folder: Path, rope_theta: float) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**TINY_LLAMA, rope_theta=rope_theta)
    ).eval()
    ref.save_pretrained(folder)
    return ref


def _assert_same_logits(ref: torch.nn.Module, folder: Path) -> None:
    ids = torch.randint(
        0, TINY_LLAMA["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        want = ref(ids).logits
        got = zoo.load(folder)(ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _edit(folder: Path, change) -> None:  # type: ignore[no-untyped-def]
    path = folder / "config.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_transformers5_rope_parameters_are_read(tmp_path):
    """transformers 5 writes rope_parameters: {rope_theta, rope_type}; a far-from-default
    theta must reach the model (positions 40 apart differ visibly between 1e4 and 5e5)."""
    ref = _llama(tmp_path, rope_theta=500000.0)
    written = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in written and "rope_theta" not in written  # really the 5.x spelling
    assert zoo.load(tmp_path).config.rope_theta == 500000.0
    _assert_same_logits(ref, tmp_path)


def test_transformers4_spelling_is_read(tmp_path):
    """The same model with a 4.x-style config.json (top-level rope_theta, rope_scaling null,
    no head_dim) loads to the same logits."""
    ref = _llama(tmp_path, rope_theta=500000.0)

    def as_v4(data: dict) -> None:
        data["rope_theta"] = data.pop("rope_parameters")["rope_theta"]
        data["rope_scaling"] = None
        data.pop("head_dim")
        data["torch_dtype"] = data.pop("dtype", "float32")
        data["transformers_version"] = "4.44.0"

    _edit(tmp_path, as_v4)
    _assert_same_logits(ref, tmp_path)


LLAMA_REFUSED = [
    ("rope_type", lambda d: d["rope_parameters"].update(rope_type="linear", factor=2.0)),
    ("rope_scaling", lambda d: d.update(rope_scaling={"type": "dynamic", "factor": 2.0})),
    ("partial_rotary_factor", lambda d: d["rope_parameters"].update(partial_rotary_factor=0.5)),
    ("disagree", lambda d: d.update(rope_theta=10000.0)),
    ("head_dim", lambda d: d.update(head_dim=16.0)),
    ("attention_bias", lambda d: d.update(attention_bias=True)),
    ("mlp_bias", lambda d: d.update(mlp_bias=True)),
    ("hidden_act", lambda d: d.update(hidden_act="gelu")),
    ("quantization_config", lambda d: d.update(quantization_config={"quant_method": "gptq"})),
    ("sliding_window", lambda d: d.update(sliding_window=16)),
    ("some_new_key", lambda d: d.update(some_new_key=3)),
    ("rms_norm_eps", lambda d: d.update(rms_norm_eps="1e-5")),
]


@pytest.mark.parametrize(("key", "change"), LLAMA_REFUSED, ids=[k for k, _ in LLAMA_REFUSED])
def test_llama_keys_zoo_cannot_honour_are_refused(tmp_path, key, change):
    _llama(tmp_path, rope_theta=500000.0)
    _edit(tmp_path, change)
    with pytest.raises(CheckpointError, match=key):
        zoo.load(tmp_path)


def _gpt2(folder: Path) -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)


def _gpt1(folder: Path) -> None:
    torch.manual_seed(0)
    config = transformers.OpenAIGPTConfig(
        vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32
    )
    transformers.OpenAIGPTLMHeadModel(config).save_pretrained(folder)


OTHER_REFUSED = [
    (_gpt2, "scale_attn_weights", False),
    (_gpt2, "scale_attn_by_inverse_layer_idx", True),
    (_gpt2, "activation_function", "swish"),
    (_gpt2, "n_embd", "32"),
    (_gpt2, "some_new_key", 1),
    (_gpt1, "afn", "silu"),
    (_gpt1, "n_special", 3),
    (_gpt1, "some_new_key", 1),
]


@pytest.mark.parametrize(("make", "key", "value"), OTHER_REFUSED)
def test_gpt_keys_zoo_cannot_honour_are_refused(tmp_path, make, key, value):
    make(tmp_path)
    zoo.load(tmp_path)  # as written by transformers, it loads
    _edit(tmp_path, lambda d: d.update({key: value}))
    with pytest.raises(CheckpointError, match=rf"{key} = {value!r}".replace("(", r"\(")):
        zoo.load(tmp_path)


def test_hub_era_configs_load(tmp_path):
    """The keys of the official openai-community config.json files (n_ctx, n_special 0,
    predict_special_tokens, task_specific_params) are known and harmless."""
    _gpt1(tmp_path)
    _edit(tmp_path, lambda d: d.update(n_ctx=32, n_special=0, predict_special_tokens=True))
    zoo.load(tmp_path)
    gpt2 = tmp_path / "gpt2"
    _gpt2(gpt2)
    _edit(gpt2, lambda d: d.update(n_ctx=32, task_specific_params={"text-generation": {}}))
    zoo.load(gpt2)


def test_huge_integer_in_config_is_a_clear_error(tmp_path):
    """A 5,000-digit integer (beyond Python's int-from-string limit) names the file."""
    _gpt2(tmp_path)
    text = (
        (tmp_path / "config.json").read_text().replace('"n_layer": 1', '"n_layer": ' + "9" * 5000)
    )
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=r"config\.json"):
        zoo.load(tmp_path)


GPT_NON_DEFAULT = [
    (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(n_inner=48, activation_function="relu", layer_norm_epsilon=1e-2),
    ),
    (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(activation_function="gelu", tie_word_embeddings=False),
    ),
    (
        transformers.OpenAIGPTConfig,
        transformers.OpenAIGPTLMHeadModel,
        dict(afn="relu", layer_norm_epsilon=1e-2),
    ),
]


@pytest.mark.parametrize(("config_cls", "model_cls", "values"), GPT_NON_DEFAULT)
def test_gpt_non_default_configs_written_by_transformers_match(
    tmp_path, config_cls, model_cls, values
):
    """Non-default GPT-2 / GPT-1 values as the installed transformers writes them reach the
    model: logits equal transformers' to 1e-5."""
    torch.manual_seed(0)
    config = config_cls(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, **values)
    ref = model_cls(config).eval()
    with torch.no_grad():  # LayerNorm weights away from 1/0, so eps and bias matter
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    ref.save_pretrained(tmp_path)
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(zoo.load(tmp_path)(ids), ref(ids).logits, rtol=1e-5, atol=1e-5)


MISSPELLED = [
    (_gpt2, "layer_norm_eps", 1e-3),  # GPT-2 spells it layer_norm_epsilon
    (_gpt1, "layer_norm_eps", 1e-3),
    (_gpt2, "n_embed", 64),
]


@pytest.mark.parametrize(("make", "key", "value"), MISSPELLED)
def test_misspelled_math_keys_are_refused(tmp_path, make, key, value):
    make(tmp_path)
    _edit(tmp_path, lambda d: d.update({key: value}))
    with pytest.raises(CheckpointError, match=rf"{key} = {value!r}"):
        zoo.load(tmp_path)


def test_llama_eps_spelled_as_layer_norm_is_refused(tmp_path):
    _llama(tmp_path, rope_theta=10000.0)
    _edit(tmp_path, lambda d: d.update(layer_norm_eps=1e-3))
    with pytest.raises(CheckpointError, match=r"layer_norm_eps = 0\.001"):
        zoo.load(tmp_path)


# -- every key zoo knows is type-checked, and named as written ----------------------------

HUB_CONFIGS = sorted((Path(__file__).parent / "data" / "hub").rglob("config.json"))


def _real_configs() -> list[tuple[str, dict]]:
    """Each family's real config.json: the vendored Hub files, and GPT-2 / GPT-1 as the
    installed transformers writes them."""
    found = [(p.parent.name, json.loads(p.read_text())) for p in HUB_CONFIGS]
    for cls in (transformers.GPT2Config, transformers.OpenAIGPTConfig):
        found.append((cls.model_type, json.loads(cls().to_json_string())))
    return found


REAL_CONFIGS = _real_configs()
#: per JSON type of a key's real value, values of other types, wrong for every key of that
#: type (an int key holds no string, bool or object; a float key no string, bool or list...)
WRONG = {int: ["7", True, {"v": 1}], float: ["0.5", True, [1.0]], bool: [1, "true", None],
         str: [1, True, ["x"]], list: ["x", 1], dict: ["x", [1]], type(None): [True]}  # fmt: skip


def _reader(data: dict):  # type: ignore[no-untyped-def]
    """The installed layout's ``config_from_foreign`` for ``data``'s ``model_type``."""
    from zoo.checkpoint.readers import foreign_layouts

    arch, layout = foreign_layouts()[data["model_type"]]
    return arch.checkpoint_layout(layout).config_from_foreign


def _types(data: dict) -> dict:  # type: ignore[type-arg]
    """The key types ``data`` is checked against: :data:`KEY_TYPES` and those its layout's
    format declares (``HFConfigFormat.types``: a plugin types its own keys)."""
    from zoo.checkpoint.hf_config import KEY_TYPES

    fmt = getattr(_reader(data), "__self__", None)
    return {**KEY_TYPES, **(fmt.types if fmt is not None else {})}


def _transformers_refuses(cls: type, data: dict) -> bool:
    try:
        cls.from_dict(data)  # type: ignore[attr-defined]
    except Exception:  # its strict dataclass validation (a huggingface_hub error)
        return True
    return False


@pytest.mark.parametrize(("name", "data"), REAL_CONFIGS, ids=[n for n, _ in REAL_CONFIGS])
def test_every_known_key_of_a_real_config_is_type_checked(name, data):
    """Property over each family's real config: every key is in the typed table, and each,
    replaced by a value of a wrong type, is refused with a message naming that key as
    written, whether or not the model uses it; the file itself still reads."""
    from zoo.checkpoint.hf_config import HFConfigError

    read = _reader(data)
    read(data)
    types = _types(data)
    assert sorted(set(data) - set(types)) == []
    for key, value in data.items():
        for bad in WRONG[type(value)]:
            if key == "early_stopping" and isinstance(bad, str):
                continue  # transformers takes true, false or "never"
            if types[key].accepts(bad):
                continue  # another type the key may hold (eos_token_id: one id or a list)
            with pytest.raises(HFConfigError, match=rf"(^|: |; ){re.escape(key)} = "):
                read({**data, key: bad})


@pytest.mark.parametrize(("name", "data"), REAL_CONFIGS, ids=[n for n, _ in REAL_CONFIGS])
def test_zoo_refuses_the_wrong_types_transformers_refuses(name, data):
    """Checked against the installed transformers: an integer key holding 2.5, or any key
    holding null, that transformers' strict config refuses, zoo refuses too, naming it."""
    from zoo.checkpoint.hf_config import HFConfigError

    read = _reader(data)
    config_class = type(transformers.AutoConfig.for_model(data["model_type"]))
    checked = 0
    for key, value in data.items():
        for bad in ([2.5] if type(value) is int else []) + [None]:
            mutated = {**data, key: bad}
            if not _transformers_refuses(config_class, mutated):
                continue
            checked += 1
            with pytest.raises(HFConfigError, match=rf"(^|: |; ){re.escape(key)} = "):
                read(mutated)
    assert checked > 3


def test_the_typed_table_covers_every_key_a_layout_knows():
    """Every key a layout reads, pins or calls inert has a type (so none escapes the check):
    in the shared table, or in its format's own ``types``."""
    from zoo.checkpoint.hf_config import INERT_KEYS, KEY_TYPES
    from zoo.checkpoint.readers import foreign_layouts

    missing = set(INERT_KEYS) - set(KEY_TYPES)
    for arch, layout in foreign_layouts().values():
        fmt = getattr(arch.checkpoint_layout(layout).config_from_foreign, "__self__", None)
        if fmt is None:
            continue  # GPT-1/GPT-2: their keys are the real configs' (the property above)
        keys = {fmt._spec(f).key for f in fmt.fields} | set(fmt.fixed) | set(fmt.checked)
        missing |= (keys | fmt.inert) - set(KEY_TYPES) - set(fmt.types)
    assert sorted(missing) == []


QWEN2_HUB = json.loads(
    (Path(__file__).parent / "data/hub/Qwen/Qwen2.5-0.5B-Instruct/config.json").read_text()
)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # moot with use_sliding_window false, yet transformers refuses it: so does zoo
        ({"sliding_window": "x"}, r"sliding_window = 'x' must be an integer or null"),
        ({"max_window_layers": None}, r"max_window_layers = None must be an integer"),
        # transformers 5 writes layer_types: the message names the key the user wrote
        ({"num_hidden_layers": 0, "layer_types": ["full_attention"] * 24},
         r"num_hidden_layers = 0 must be a positive integer"),
        ({"num_key_value_heads": 3},
         r"num_key_value_heads = 3: must divide num_attention_heads = 14"),
        ({"num_attention_heads": 5}, r"hidden_size = 896: must be divisible by "
         r"num_attention_heads = 5"),
        ({"rms_norm_eps": 0.0}, r"rms_norm_eps = 0\.0 must be a positive number"),
        ({"num_hidden_layers": 10**6}, r"num_hidden_layers = 1000000: must be at most"),
    ],
)  # fmt: skip
def test_qwen2_refusals_name_the_key_as_written(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**QWEN2_HUB, **change}))
    with pytest.raises(CheckpointError, match=message) as caught:
        zoo.load(tmp_path)
    assert not re.search(
        r"\b(n_layers|n_kv_heads|n_heads|d_model|layer_norm_eps|layer_types)\b", str(caught.value)
    )


def test_gpt2_refusals_name_the_key_as_written():
    read = _reader({"model_type": "gpt2"})
    data = json.loads(transformers.GPT2Config(n_embd=30, n_head=4).to_json_string())
    with pytest.raises(ValueError, match=r"n_embd = 30: must be divisible by n_head = 4"):
        read(data)


def _format(**fields):
    """Llama's config.json with some fields spelled otherwise (a plugin's declaration)."""
    import dataclasses

    from zoo_plugins.llama.convert import LLAMA_CONFIG

    from zoo.checkpoint.hf_format import LLAMA_FIELDS

    return dataclasses.replace(LLAMA_CONFIG, fields={**LLAMA_FIELDS, **fields})


def _written(config_format, **overrides):
    from zoo.api import resolve_config

    return config_format.write(resolve_config("llama-tiny")[2].replace(**overrides))


def test_a_read_conversion_is_honoured_for_rope_theta_and_rotary_dim():
    """``HFField(read=, write=)`` converts every field; it was ignored for the two that have
    their own reading (a base spelled as its log10, a rotary count spelled in halves)."""
    import math

    from zoo.checkpoint.hf_format import HFField

    spelled = _format(
        rope_theta=HFField(
            "rope_log10", 4.0, read=lambda v: 10.0**v, write=lambda c: math.log10(c.rope_theta)
        ),
        rotary_dim=HFField(
            "rotary_halves",
            read=lambda v: None if v is None else 2 * v,
            write=lambda c: None if c.rotary_dim is None else c.rotary_dim // 2,
        ),
    )
    data = _written(spelled, rope_theta=1000.0, rotary_dim=4)
    assert data["rope_log10"] == 3.0 and data["rotary_halves"] == 2
    values = spelled.read(data)
    assert values["rope_theta"] == 1000.0 and values["rotary_dim"] == 4


def test_a_nested_sub_config_key_is_read_written_and_checked_key_by_key():
    """MPT's ``attn_config``: a dotted key reads from and writes into the object; a key of
    the object nothing reads is refused by its dotted name, a parent that is not an object
    by name too."""
    from zoo.checkpoint.hf_format import HFField

    spelled = _format(rope_theta=HFField("attn_config.rope_theta", 10000.0),
                      layer_norm_eps=HFField("attn_config.eps", 1e-6))  # fmt: skip
    data = _written(spelled, rope_theta=5e4, layer_norm_eps=1e-5)
    assert data["attn_config"] == {"rope_theta": 5e4, "eps": 1e-5}
    values = spelled.read(data)
    assert values["rope_theta"] == 5e4 and values["layer_norm_eps"] == 1e-5
    with pytest.raises(ValueError, match=r"attn_config\.alibi = True means"):
        spelled.read({**data, "attn_config": {**data["attn_config"], "alibi": True}})
    with pytest.raises(ValueError, match=r"attn_config = 3 must be an object"):
        spelled.read({**data, "attn_config": 3})
