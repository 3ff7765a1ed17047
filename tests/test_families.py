"""Every family zoo ships against transformers' own class, on tiny random configs written with
``save_pretrained``: float32 logits within 1e-5 on a batch with left and right padding, greedy
tokens equal to transformers' ``generate`` (one row and a left-padded batch), the export
loaded back by ``from_pretrained``, and ``quantize=`` / ``compile=True`` generation.

Each case states the geometry that family adds: Qwen2's q/k/v biases, Qwen3's heads apart
from the width and q/k norms, Mistral's sliding window, Mixtral's experts, GPT-NeoX's
parallel residual, partial rotary and interleaved ``query_key_value``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from parity import max_logit_diff, padded_batch

import zoo
from zoo.generation import GenerationConfig, generate_ids

COMMON = {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 96, "max_position_embeddings": 128}  # fmt: skip
LLAMA_LIKE = {**COMMON, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False}  # fmt: skip

#: family -> (architecture, transformers model class, its config values)
FAMILIES: dict[str, tuple[str, type, dict[str, Any]]] = {
    "qwen2": ("qwen2", transformers.Qwen2ForCausalLM,
              {**LLAMA_LIKE, "tie_word_embeddings": True}),
    "qwen3": ("qwen3", transformers.Qwen3ForCausalLM, {**LLAMA_LIKE, "head_dim": 24}),
    "mistral": ("mistral", transformers.MistralForCausalLM, {**LLAMA_LIKE, "sliding_window": 7}),
    "mixtral": ("mixtral", transformers.MixtralForCausalLM,
                {**LLAMA_LIKE, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "gpt-neox": ("gpt-neox", transformers.GPTNeoXForCausalLM,
                 {**COMMON, "rotary_pct": 0.25, "use_parallel_residual": True}),
    "gpt-neox-sequential": ("gpt-neox", transformers.GPTNeoXForCausalLM,
                            {**COMMON, "rotary_pct": 0.5, "use_parallel_residual": False}),
    "smollm2-like": ("llama", transformers.LlamaForCausalLM,
                     {**LLAMA_LIKE, "tie_word_embeddings": True, "rope_theta": 100000.0}),
    "phi3": ("phi3", transformers.Phi3ForCausalLM,
             {**LLAMA_LIKE, "sliding_window": 7, "partial_rotary_factor": 0.5}),
    "gemma2": ("gemma2", transformers.Gemma2ForCausalLM,
               {**LLAMA_LIKE, "head_dim": 24, "query_pre_attn_scalar": 20, "sliding_window": 5,
                "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
    "olmo2": ("olmo2", transformers.Olmo2ForCausalLM, {**LLAMA_LIKE, "rms_norm_eps": 1e-6}),
    "gemma3": ("gemma3", transformers.Gemma3ForCausalLM,
               {**COMMON, "num_key_value_heads": 2, "head_dim": 24, "query_pre_attn_scalar": 16,
                "sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"],
                "rope_theta": 10000.0, "rope_local_base_freq": 100.0}),
}  # fmt: skip


def reference(family: str, folder: Path, seed: int = 0) -> torch.nn.Module:
    """transformers' model of ``family``, random (norms too), saved to ``folder``."""
    _, cls, values = FAMILIES[family]
    torch.manual_seed(seed)
    config = cls.config_class(**values, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = cls(config).eval()
    with torch.no_grad():  # transformers initialises norms to 1 and biases to 0: make them count
        for name, p in model.named_parameters():
            if "norm" in name or "layernorm" in name:
                p.normal_(1.0, 0.1)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return model


@pytest.fixture(params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return request.param


def test_logits_match_transformers(family: str, tmp_path: Path) -> None:
    ref = reference(family, tmp_path)
    model = zoo.load(tmp_path)
    assert type(model.config).architecture == FAMILIES[family][0]
    diff = max_logit_diff(model, ref, *padded_batch(COMMON["vocab_size"]))
    print(f"{family}: max |zoo - transformers| = {diff:.2e}")
    assert diff <= 1e-5


def test_greedy_tokens_equal_transformers_generate(family: str, tmp_path: Path) -> None:
    ref = reference(family, tmp_path, seed=2)
    model = zoo.load(tmp_path)
    ids, _ = padded_batch(COMMON["vocab_size"], seed=3)
    prompt = ids[:1, :10]
    # no end id: transformers must not stop at, nor (min_new_tokens) suppress, token 2
    want = ref.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None)
    assert torch.equal(zoo.generate(model, prompt, max_new_tokens=20, temperature=0), want)


def test_left_padded_batch_greedy_equals_each_row_alone(family: str, tmp_path: Path) -> None:
    reference(family, tmp_path, seed=4)
    model = zoo.load(tmp_path)
    ids, _ = padded_batch(COMMON["vocab_size"], seed=5)
    rows = [ids[0, :12], ids[1, :7]]
    mask = torch.zeros(2, 12, dtype=torch.long)
    batch = torch.zeros(2, 12, dtype=torch.long)
    for r, row in enumerate(rows):
        batch[r, 12 - len(row) :], mask[r, 12 - len(row) :] = row, 1
    greedy = GenerationConfig(max_new_tokens=12, temperature=0)
    together = generate_ids(model, batch, mask, greedy)
    for r, row in enumerate(rows):
        alone = zoo.generate(model, row[None], max_new_tokens=12, temperature=0)
        assert torch.equal(together[r, 12:], alone[0, len(row) :]), f"row {r}"


def test_export_loads_back_in_transformers(family: str, tmp_path: Path) -> None:
    cls = FAMILIES[family][1]
    ref = reference(family, tmp_path / "theirs")
    model = zoo.load(tmp_path / "theirs")
    zoo.export(model, tmp_path / "ours")
    back = cls.from_pretrained(tmp_path / "ours").eval()
    ids, _ = padded_batch(COMMON["vocab_size"])
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, ref(ids).logits, rtol=0, atol=1e-6)
    again = zoo.load(tmp_path / "ours")
    for key, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


#: Families whose tiny random models int8 tracks less closely, by their arithmetic: OLMo-2's
#: norms after each branch rescale each branch's quantization error to the residual's scale
#: (9% relative logit error; transformers' own Olmo2ForCausalLM under torch.ao dynamic int8
#: errs as much, 0.089 against zoo's 0.088, where Qwen3's err 0.036 and 0.034). Gemma 3 adds
#: q/k norms whose (1 + w) ~ 2 sharpen the scores fourfold: top-1 agreement 0.74-0.90 over
#: seeds 6-10, relative error 0.12-0.16, where Gemma3ForCausalLM under torch.ao dynamic int8
#: agrees 0.76-0.82 and errs 0.13-0.16.
INT8_AGREE = {"olmo2": 0.8, "gemma3": 0.7}


def test_int8_quantized_generation_tracks_float(family: str, tmp_path: Path) -> None:
    reference(family, tmp_path, seed=6)
    model = zoo.load(tmp_path)
    quantized = zoo.load(tmp_path, quantize="int8")
    ids, _ = padded_batch(COMMON["vocab_size"])
    with torch.no_grad():
        full, small = model(ids), quantized(ids)
    agree = (full.argmax(-1) == small.argmax(-1)).float().mean()
    least = INT8_AGREE.get(family, 0.9)
    assert agree >= least, f"int8 picks the float model's top token at only {agree:.0%}"
    assert zoo.generate(quantized, ids[:1, :8], max_new_tokens=6, temperature=0).shape == (1, 14)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", ["mixtral", "gpt-neox", "gemma2", "gemma3", "olmo2"])
def test_compiled_decoding_equals_eager(compiled: str, tmp_path: Path, fresh_dynamo) -> None:
    """The families whose step differs from Llama's: the mixture's fixed-shape form, the
    parallel residual with partial rotary, Gemma 2's soft caps and sandwich norms, Gemma 3's
    rotary base per layer type with heads apart from the width and per-head q/k norms,
    OLMo-2's norms after each branch and over the whole q/k width. The rest share Llama's
    step: Qwen3's heads apart and per-head q/k norms are the attention's q_norm/k_norm seams
    that Gemma 3 compiles here (head_dim 24 against a width of 64 over 4 heads), holding
    Llama's RMSNorm; Phi-3's is Llama's with the partial rotary compiled here (gpt-neox) and
    the window compiled in tests/test_static_decoding.py, as are Llama's own step and the
    window.

    The step is one graph: nothing in it breaks dynamo's trace (zoo's ctypes kernels did,
    cutting each step into a dozen separately compiled graphs)."""
    family = compiled
    reference(family, tmp_path, seed=7)
    model = zoo.load(tmp_path)
    prompt = padded_batch(COMMON["vocab_size"])[0][:1, :10]
    eager = zoo.generate(model, prompt, max_new_tokens=12, temperature=0)
    compiled = zoo.generate(model, prompt, max_new_tokens=12, temperature=0, compile=True)
    assert torch.equal(compiled, eager)
    assert fresh_dynamo["stats"]["unique_graphs"] >= 1, "the step was not compiled"
    assert not fresh_dynamo["graph_break"], dict(fresh_dynamo["graph_break"])


# -- config.json: both transformers spellings; what zoo cannot honour is refused -----------


def _edit_config(folder: Path, change: Any) -> None:
    path = folder / "config.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _as_transformers4_neox(data: dict[str, Any]) -> None:
    rope = data.pop("rope_parameters")
    data.update(rotary_pct=rope["partial_rotary_factor"], rotary_emb_base=rope["rope_theta"])
    data["torch_dtype"] = data.pop("dtype")
    data["transformers_version"] = "4.24.0"


def _as_transformers4_llama(data: dict[str, Any]) -> None:
    data["rope_theta"] = data.pop("rope_parameters")["rope_theta"]
    data.pop("layer_types", None)
    data["torch_dtype"] = data.pop("dtype")


@pytest.mark.parametrize(
    ("family", "change"),
    [("gpt-neox", _as_transformers4_neox), ("gpt-neox-sequential", _as_transformers4_neox),
     ("qwen3", _as_transformers4_llama), ("mixtral", _as_transformers4_llama)],
)  # fmt: skip
def test_transformers4_spelling_loads_the_same_model(family: str, change: Any, tmp_path: Path):
    ref = reference(family, tmp_path)
    _edit_config(tmp_path, change)
    ids, _ = padded_batch(COMMON["vocab_size"])
    with torch.no_grad():
        torch.testing.assert_close(zoo.load(tmp_path)(ids), ref(ids).logits, rtol=0, atol=1e-5)


def test_mistral_without_a_window_key_gets_transformers_default(tmp_path: Path) -> None:
    reference("mistral", tmp_path)
    _edit_config(tmp_path, lambda d: d.pop("sliding_window"))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).sliding_window
    assert zoo.load(tmp_path).config.sliding_window == theirs == 4096
    _edit_config(tmp_path, lambda d: d.update(sliding_window=None))
    assert zoo.load(tmp_path).config.sliding_window is None


REFUSED = [
    ("qwen2", "use_sliding_window", lambda d: d.update(use_sliding_window=True)),
    ("qwen3", "layer_types", lambda d: d.update(layer_types=["sliding_attention"] * 2)),
    ("qwen3", "attention_bias", lambda d: d.update(attention_bias=True)),
    ("mixtral", "norm_topk_prob", lambda d: d.update(norm_topk_prob=False)),
    ("mixtral", r"num_experts_per_tok = 9: must be in \[1, num_local_experts = 4\]",
     lambda d: d.update(num_experts_per_tok=9)),  # named as written, not experts_per_token
    ("gpt-neox", "rope_scaling", lambda d: d.update(rope_scaling={"type": "linear", "factor": 2})),
    ("gpt-neox", "hidden_act", lambda d: d.update(hidden_act="gelu_new")),
    ("gpt-neox", "partial_rotary_factor",
     lambda d: d["rope_parameters"].update(partial_rotary_factor=1.5)),
    ("mistral", "sliding_window", lambda d: d.update(sliding_window="4096")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("family", "key", "change"), REFUSED, ids=[f"{f}-{k}" for f, k, _ in REFUSED]
)
def test_keys_zoo_cannot_honour_are_refused(family: str, key: str, change: Any, tmp_path: Path):
    reference(family, tmp_path)
    _edit_config(tmp_path, change)
    with pytest.raises(zoo.ZooError, match=key):
        zoo.load(tmp_path)


def test_a_layout_holds_any_window_where_config_json_carries_it(tmp_path: Path) -> None:
    """``represents`` derived from the config class: Mistral's layout holds any window (the
    config says which); Llama's holds none, so export refuses a windowed Llama."""
    windowed = zoo.build("mistral-7b-v0.3", **_SMALL, sliding_window=5)
    zoo.export(windowed, tmp_path / "mistral")
    assert transformers.AutoConfig.from_pretrained(tmp_path / "mistral").sliding_window == 5
    with pytest.raises(zoo.CheckpointError, match="sliding_window = 5"):
        zoo.export(zoo.build("llama-tiny", sliding_window=5), tmp_path / "llama")


_SMALL = {"vocab_size": 300, "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2,
          "d_ff": 96, "context_length": 128}  # fmt: skip


# -- the named models are the official ones ----------------------------------------------

HUB = Path(__file__).parent / "data" / "hub"
NAMED = {
    "qwen2.5-0.5b-instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "mistral-7b-v0.3": "mistralai/Mistral-7B-v0.3",
    "pythia-160m": "EleutherAI/pythia-160m",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "phi-3-mini-4k-instruct": "microsoft/Phi-3-mini-4k-instruct",
    "olmo-2-1b-instruct": "allenai/OLMo-2-0425-1B-Instruct",
    "gemma-2-2b-it": "google/gemma-2-2b-it",
    "gemma-3-1b-it": "google/gemma-3-1b-it",
    "opus-mt-en-de": "Helsinki-NLP/opus-mt-en-de",
    "opus-mt-tr-en": "Helsinki-NLP/opus-mt-tr-en",
    "flan-t5-small": "google/flan-t5-small",
    "bart-large-cnn": "facebook/bart-large-cnn",
}


def test_vendored_hub_files_are_the_pinned_bytes() -> None:
    rows = re.findall(r"^\| `([^`]+)` \| `[0-9a-f]+` \| `([0-9a-f]{64})` \|$",
                      (HUB / "README.md").read_text(), flags=re.M)  # fmt: skip
    assert len(rows) == len(list(HUB.rglob("*.json"))) > 0
    for name, sha256 in rows:
        assert hashlib.sha256((HUB / name).read_bytes()).hexdigest() == sha256, name


@pytest.mark.parametrize("name", list(NAMED))
def test_named_model_config_is_the_official_config_json(name: str) -> None:
    """Each named model's sizes, read through its own layout from the official config.json
    (at the pinned revision), are exactly the registry's, and its weights pin that repo."""
    arch, spec, config = zoo.get_registry().resolve(name)
    assert spec.weights is not None and spec.weights.repo == NAMED[name]
    assert len(spec.weights.revision) == 40
    official = json.loads((HUB / NAMED[name] / "config.json").read_text())
    layout = arch.checkpoint_layout(spec.weights.layout)
    assert layout.model_type == official["model_type"]
    read = arch.config_class.from_dict(layout.config_from_foreign(official))
    if getattr(config, "layer_pattern", None) is not None:  # the file lists every layer
        kinds = tuple(config.layer_type(i) for i in range(config.n_layers))
        config = config.replace(layer_types=kinds, layer_pattern=None)
    assert read == config


def test_mixtral_8x7b_builds_on_meta_at_full_size() -> None:
    model = zoo.build("mixtral-8x7b", device="meta")
    params = sum(p.numel() for p in model.parameters())
    assert 46.6e9 < params < 46.8e9  # Mixtral 8x7B: 46.7B parameters
    ffn = model.blocks[0].ffn
    assert len(ffn.experts) == 8 and ffn.top_k == 2


#: encoder-decoder -> (transformers' class, its parameters, those zoo does not store)
ENCODER_DECODERS = {
    "opus-mt-en-de": ("MarianMTModel", 74_410_496, 2 * 512 * 512),  # its fixed sin|cos tables
    "opus-mt-tr-en": ("MarianMTModel", 76_605_952, 2 * 512 * 512),
    "flan-t5-small": ("T5ForConditionalGeneration", 76_961_152, 0),
    "bart-large-cnn": ("BartForConditionalGeneration", 406_290_432, 0),
}


@pytest.mark.parametrize("name", list(ENCODER_DECODERS))
def test_an_encoder_decoder_builds_on_meta_with_the_official_parameter_count(name: str):
    """Each named encoder-decoder at full size has transformers' parameter count for the
    official config.json (less Marian's fixed position tables, which zoo computes), and the
    published figure (opus-mt-en-de 74M, flan-t5-small 77M, bart-large-cnn 406M)."""
    cls_name, published, computed = ENCODER_DECODERS[name]
    model = zoo.build(name, device="meta")
    ours = sum(p.numel() for p in model.parameters())
    folder = HUB / NAMED[name]
    with torch.device("meta"):
        reference = getattr(transformers, cls_name)(transformers.AutoConfig.from_pretrained(folder))
    theirs = sum(p.numel() for p in reference.parameters())
    head = reference.get_output_embeddings().weight
    untied = not json.loads((folder / "config.json").read_text()).get("tie_word_embeddings", True)
    if untied and head is reference.get_input_embeddings().weight:
        theirs += head.numel()  # transformers 5 ties T5 v1.1's head; the file (4.x) does not
    assert ours + computed == theirs == published


@pytest.mark.parametrize("name", ["flan-t5-small", "bart-large-cnn"])
def test_an_encoder_decoders_generation_settings_are_its_official_file(name: str) -> None:
    """zoo reads the official generation_config.json (what zoo.load attaches and zoo.generate
    takes its defaults from) as transformers reads it: every key zoo honours, same value."""
    from zoo.checkpoint.generation_file import read_generation_file

    folder = HUB / NAMED[name]
    ours = read_generation_file(folder)
    theirs = transformers.GenerationConfig.from_pretrained(folder)
    assert ours is not None
    honoured = [f.name for f in dataclasses.fields(ours)]
    written = json.loads((folder / "generation_config.json").read_text())
    assert set(written) - {"_from_model_config", "transformers_version"} <= set(honoured) | {
        "bos_token_id", "eos_token_id", "pad_token_id"}  # fmt: skip
    for key in honoured:
        value = getattr(ours, key)
        expected = getattr(theirs, key) if key in written else None
        assert value == (tuple(expected) if isinstance(expected, list) else expected), key
    if name == "bart-large-cnn":  # the summarization settings: 4 beams, 142 tokens at most
        assert (ours.num_beams, ours.length_penalty, ours.max_length) == (4, 2.0, 142)


class _Variants:
    """Named models whose config no Hugging Face layout of their architecture can hold."""

    @zoo.hookimpl
    def zoo_models(self) -> list[zoo.ModelSpec]:
        tiny = {"vocab_size": 320, "context_length": 64, "d_model": 64, "n_heads": 4,
                "n_kv_heads": 2, "n_layers": 2, "d_ff": 96}  # fmt: skip
        return [
            zoo.ModelSpec(name="llama-qkv-bias", architecture="llama", tokenizer="byte",
                          config={**tiny, "qkv_bias": True}),
            zoo.ModelSpec(name="qwen2-qk-norm", architecture="qwen2", tokenizer="byte",
                          config={**tiny, "qk_norm": True}),
        ]  # fmt: skip


@pytest.mark.parametrize("name", ["llama-qkv-bias", "qwen2-qk-norm"])
def test_the_kit_passes_a_model_its_layout_cannot_hold(name: str, use_registry: Any, tmp_path):
    """The kit's layout check honours ``represents``, as export does: a Llama with q/k/v
    biases (or a Qwen2 with q/k norms) is a valid zoo model that the HF layout cannot hold."""
    from zoo.plugin.current import load_registry
    from zoo.testing import CHECKS, CheckSkipped, run_check

    use_registry(load_registry(plugins={"variants": _Variants()}))
    skipped = {}
    for check in CHECKS:
        try:
            run_check(name, check)
        except CheckSkipped as exc:  # said, never passed silently
            skipped[check] = str(exc)
    assert set(skipped) == {"checkpoint_layouts", "reference"}
    assert all("cannot hold the small model" in why for why in skipped.values()), skipped
    with pytest.raises(zoo.CheckpointError, match="cannot hold this model"):
        zoo.export(zoo.build(name), tmp_path / "hf")


@pytest.mark.parametrize(
    ("template", "repo"),
    [("qwen2.5-instruct", "Qwen/Qwen2.5-0.5B-Instruct"), ("qwen3", "Qwen/Qwen3-0.6B"),
     ("smollm2-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")],
)  # fmt: skip
def test_chat_test_templates_are_the_official_ones(template: str, repo: str) -> None:
    """The templates the chat tests render (tests/data/chat_templates) are byte for byte
    the ``chat_template`` of the official, hash-verified tokenizer_config.json."""
    official = json.loads((HUB / repo / "tokenizer_config.json").read_text())["chat_template"]
    path = Path(__file__).parent / "data" / "chat_templates" / f"{template}.jinja"
    assert path.read_text() == official


def test_the_add_a_family_page_shows_the_qwen3_plugin_as_it_is() -> None:
    """docs/families.md walks the qwen3 plugin file by file: each file's block is the file,
    its relative imports spelled as a plugin outside zoo's tree spells them."""
    root = Path(__file__).parents[1]
    page = (root / "docs" / "families.md").read_text()
    absolute = {"from ..": "from zoo_plugins.", "from .config": "from zoo_plugins.qwen3.config"}
    names = ["__init__.py", "config.py", "convert.py"]
    assert sorted(p.name for p in (root / "plugins" / "qwen3").glob("*.py")) == names
    for name in names:
        section = page[page.index(f"`{name}`\n") :]
        block = section[section.index("```python\n") + 10 : section.index("\n```\n")] + "\n"
        text = (root / "plugins" / "qwen3" / name).read_text()
        for relative, spelled in absolute.items():
            text = text.replace(relative, spelled)
        assert block == text, f"docs/families.md shows plugins/qwen3/{name} otherwise"
    section = page[page.index("`registry.toml`\n") :]
    table = section[section.index("```toml\n") + 8 : section.index("\n```\n")] + "\n"
    assert table.startswith('[models."qwen3-0.6b"]\n')
    assert table in (root / "registry.toml").read_text(), "docs/families.md shows another table"


def test_the_fixed_shape_mixture_equals_the_gathered_one() -> None:
    """What a compiled or CUDA-graph step runs (every expert on every token, weighted) gives
    what eager mode's gathered routing gives, and the routing renormalises the top k."""
    torch.manual_seed(0)
    ffn = zoo.build("mixtral-tiny").blocks[0].ffn
    h = torch.randn(37, 64)
    chosen, weights = ffn.routing(h)
    assert chosen.shape == (37, 2) and torch.allclose(weights.sum(-1), torch.ones(37))
    gathered, dense = ffn._gathered(h, chosen, weights), ffn._dense(h, chosen, weights)
    torch.testing.assert_close(dense, gathered, rtol=1e-6, atol=1e-6)
    assert (gathered.abs() > 0).all()
