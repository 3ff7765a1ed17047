"""Generation: the KV cache changes nothing, parity with transformers, sampling, batching,
streaming, stop conditions and bad arguments."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from zoo.generation import filter_logits, next_tokens
from zoo.testing import available_devices, small_overrides

transformers = pytest.importorskip("transformers")


def lively(model: torch.nn.Module, std: float = 1.0, seed: int = 0) -> torch.nn.Module:
    """Re-draw the weight matrices with a large std so that greedy decoding does not collapse
    into repeating one token (which would let a broken cache pass). A token embedding scaled
    by sqrt(d_model) and tied to the head (Gemma) is drawn d_model times narrower: at full
    width each token's own vector outweighs the branches a sandwich block norms to RMS 1, and
    the tied head picks the input token again, every step."""
    g = torch.Generator().manual_seed(seed)
    config = getattr(model, "config", None)
    narrow = (  # Gemma's sandwich blocks; not the encoder-decoder's post-LN ones
        getattr(config, "scale_embeddings", False)
        and getattr(config, "tie_embeddings", False)
        and getattr(config, "block", None) == "sandwich"
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                scale = std / config.d_model if narrow and name == "tok_emb.weight" else std
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


#: Draws that decode lively where the first does not: a random Marian collapses into one
#: repeated token for most draws (transformers' MarianMTModel with the same weights does the
#: same: tests/test_encdec_start.py, test_family_marian), which would let a broken cache pass.
LIVELY_SEEDS = {"opus-mt-en-de": 3, "opus-mt-tr-en": 3}


def small(name: str, device: str = "cpu", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = zoo.build(name, **{**small_overrides(name), **overrides})
    return lively(model, seed=LIVELY_SEEDS.get(name, 0)).to(device)


def greedy_by_recomputation(model, prompt: list[int], n: int, start_id: int = 1) -> list[int]:
    """The reference: no cache, the whole sequence recomputed for every new token."""
    device = next(model.parameters()).device
    src = torch.tensor([prompt], device=device)
    seq = [start_id] if model.is_encoder_decoder else list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids = torch.tensor([seq], device=device)
            logits = model(src, ids) if model.is_encoder_decoder else model(ids)
            seq.append(int(logits[0, -1].argmax()))
    return seq


@pytest.mark.parametrize("device", available_devices())
@pytest.mark.parametrize("name", zoo.list_models())
def test_cache_equals_recomputation(name, device):
    model = small(name, device)
    prompt = [3, 17, 42, 7, 99, 5]
    ours = zoo.generate(model, prompt, max_new_tokens=12, temperature=0, start_id=1)
    assert ours == greedy_by_recomputation(model, prompt, 12)
    assert len(set(ours[-12:])) > 2, "degenerate model: the test would prove little"


@pytest.mark.parametrize(
    ("name", "layout", "hf_class", "hf_config"),
    [
        ("gpt2-124m", "hf-gpt2", "GPT2LMHeadModel", "GPT2Config"),
        ("gpt1", "hf-openai-gpt", "OpenAIGPTLMHeadModel", "OpenAIGPTConfig"),
    ],
)
def test_greedy_equals_transformers_generate(name, layout, hf_class, hf_config):
    torch.manual_seed(0)
    config = getattr(transformers, hf_config)(
        n_embd=64, n_head=4, n_layer=2, n_positions=64, vocab_size=300
    )
    hf = lively(getattr(transformers, hf_class)(config))
    keymap = zoo.get_registry().architecture(zoo.resolve_config(name)[0].name)
    keymap = keymap.checkpoint_layout(layout)
    model = zoo.build(name, **keymap.config_from_foreign(config.to_dict())).eval()
    model.load_state_dict(keymap.to_zoo(hf.state_dict())[0])
    ids = torch.tensor([[5, 80, 3, 250, 17, 9], [44, 45, 46, 47, 48, 49]])
    expected = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=30,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    ours = zoo.generate(model, ids, max_new_tokens=30, temperature=0)
    assert torch.equal(ours, expected)
    assert len(set(ours[0, 6:].tolist())) > 3


@pytest.mark.parametrize("name", ["gpt2-124m", "transformer-encdec"])
def test_batched_prompts_equal_one_by_one(name):
    model = small(name)
    prompts = [[5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9], [100], [9, 8, 7, 6]]
    alone = [zoo.generate(model, p, max_new_tokens=10, temperature=0, start_id=1) for p in prompts]
    assert zoo.generate(model, prompts, max_new_tokens=10, temperature=0, start_id=1) == alone


def test_sampling_is_reproducible_with_a_seed():
    model = small("gpt2-124m")
    kwargs = {"max_new_tokens": 20, "temperature": 1.0, "top_k": 50, "top_p": 0.9}
    a = zoo.generate(model, [[1, 2, 3], [4, 5]], seed=7, **kwargs)
    assert a == zoo.generate(model, [[1, 2, 3], [4, 5]], seed=7, **kwargs)
    assert a != zoo.generate(model, [[1, 2, 3], [4, 5]], seed=8, **kwargs)


def _allowed(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> set[int]:
    """The reference sets, computed one token at a time in plain Python."""
    values = logits.tolist()
    order = sorted(range(len(values)), key=lambda i: -values[i])
    allowed = set(order)
    if top_k is not None:
        kth = values[order[min(top_k, len(values)) - 1]]
        allowed = {i for i in allowed if values[i] >= kth}
    if top_p is not None:
        probs = torch.tensor(values).softmax(0).tolist()
        nucleus, mass = set(), 0.0
        for i in order:
            nucleus.add(i)
            mass += probs[i]
            if mass >= top_p:
                break
        allowed &= nucleus | {order[0]}
    return allowed


@settings(max_examples=60, deadline=None)
@given(
    vocab=st.integers(2, 40),
    top_k=st.one_of(st.none(), st.integers(1, 45)),
    top_p=st.one_of(st.none(), st.floats(0.01, 1.0)),
    seed=st.integers(0, 2**31 - 1),
)
def test_sampling_never_leaves_the_top_k_top_p_set(vocab, top_k, top_p, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, vocab, generator=g) * 3
    allowed = _allowed(logits[0], top_k, top_p)
    batch = logits.expand(200, vocab)
    drawn = next_tokens(batch, temperature=1.0, top_k=top_k, top_p=top_p, generator=g)
    assert set(drawn.tolist()) <= allowed
    kept = torch.isfinite(filter_logits(logits, top_k=top_k, top_p=top_p)[0]).nonzero()
    assert set(kept.flatten().tolist()) <= allowed | {int(logits.argmax())}


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return zoo.tokenizer("gpt2-124m")


def test_text_in_text_out_and_streaming(gpt2_tokenizer):
    model = small("gpt2-124m", vocab_size=50257)
    text = zoo.generate(
        model, "Every effort moves you", tokenizer=gpt2_tokenizer, max_new_tokens=15, temperature=0
    )
    assert isinstance(text, str) and text
    pieces = list(
        zoo.generate(
            model,
            "Every effort moves you",
            tokenizer=gpt2_tokenizer,
            max_new_tokens=15,
            temperature=0,
            stream=True,
        )
    )
    assert len(pieces) > 1 and "".join(pieces) == text
    texts = zoo.generate(
        model,
        ["Hello", "Every effort moves you"],
        tokenizer=gpt2_tokenizer,
        max_new_tokens=15,
        temperature=0,
    )
    assert texts[1] == text


def test_stop_strings_cut_the_text(gpt2_tokenizer):
    model = small("gpt2-124m", vocab_size=50257)
    full = zoo.generate(
        model, "Hello world", tokenizer=gpt2_tokenizer, max_new_tokens=20, temperature=0
    )
    stop = full[5:8]
    cut = zoo.generate(
        model, "Hello world", tokenizer=gpt2_tokenizer, max_new_tokens=20, temperature=0, stop=stop
    )
    assert cut == full[: full.find(stop)]
    streamed = "".join(
        zoo.generate(
            model,
            "Hello world",
            tokenizer=gpt2_tokenizer,
            max_new_tokens=20,
            temperature=0,
            stop=[stop],
            stream=True,
        )
    )
    assert streamed == cut


def test_end_of_text_stops_a_row_and_pads_the_rest():
    model = small("gpt2-124m")
    free = zoo.generate(
        model, torch.tensor([[1, 2, 3], [4, 5, 6]]), max_new_tokens=10, temperature=0
    )
    eos = int(free[0, 5])  # the third new token of row 0 becomes "end of text"
    tok = types.SimpleNamespace(eos_id=eos, bos_id=None, vocab_size=1000)
    out = zoo.generate(
        model, torch.tensor([[1, 2, 3], [4, 5, 6]]), tokenizer=tok, max_new_tokens=10, temperature=0
    )
    first = out[0].tolist()
    assert first[: first.index(eos) + 1] == free[0, : first.index(eos) + 1].tolist()
    assert all(t == eos for t in first[first.index(eos) :])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": -1}, "max_new_tokens must be a positive integer"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
        ({"max_new_tokens": 5, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"max_new_tokens": 5, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"max_new_tokens": 5, "top_k": 0}, "top_k must be a positive integer"),
        ({"max_new_tokens": 5, "temperature": -1}, "temperature must be a finite number >= 0"),
        ({"max_new_tokens": 5, "temperature": float("nan")}, "temperature must be a finite"),
        ({"max_new_tokens": 5, "temperature": float("inf")}, "temperature must be a finite"),
        ({"max_new_tokens": 5, "start_id": 1.5}, "start_id must be int"),
        ({"max_new_tokens": 5, "start_id": True}, "start_id must be int"),
        ({"max_new_tokens": 5, "stop": [""]}, "stop must be a non-empty string"),
        ({"max_new_tokens": 60}, "exceeds the context length 64"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, message):
    model = small("gpt2-124m")
    with pytest.raises(ValueError, match=message):
        zoo.generate(model, [1, 2, 3, 4, 5], **kwargs)


def test_a_tiny_temperature_samples_like_greedy():
    """Dividing raw logits by 1e-300 overflows to inf and softmax gives nan."""
    model = small("gpt2-124m")
    greedy = zoo.generate(model, [1, 2, 3], max_new_tokens=6, temperature=0)
    assert zoo.generate(model, [1, 2, 3], max_new_tokens=6, temperature=1e-300, seed=0) == greedy


@pytest.mark.parametrize(
    "prompt",
    [torch.tensor([[1.7, 2.0]]), torch.tensor([[True, False]]), [1.7, 2], [True, 2], [[1, 2.5]]],
)
def test_ids_must_be_integers(prompt):
    with pytest.raises(ValueError, match="int"):
        zoo.generate(small("gpt2-124m"), prompt, max_new_tokens=2)


def test_bad_prompts_are_clear_errors():
    model = small("gpt2-124m")
    with pytest.raises(ValueError, match="a prompt is empty"):
        zoo.generate(model, [[1, 2], []], max_new_tokens=3)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 1000\)"):
        zoo.generate(model, [1, 5000], max_new_tokens=3)
    with pytest.raises(ValueError, match="single prompt"):
        zoo.generate(
            model,
            [[1], [2]],
            max_new_tokens=3,
            stream=True,
            tokenizer=types.SimpleNamespace(eos_id=None, bos_id=None, vocab_size=1000),
        )
    with pytest.raises(ValueError, match="needs start_id"):
        zoo.generate(
            small("transformer-encdec"),
            [1, 2],
            max_new_tokens=3,
            tokenizer=types.SimpleNamespace(eos_id=None, bos_id=None, vocab_size=1000),
        )


def test_generation_leaves_the_model_in_its_mode():
    model = small("gpt2-124m").train()
    zoo.generate(model, [1, 2, 3], max_new_tokens=2, temperature=0)
    assert model.training


def test_streaming_runs_the_callers_code_outside_inference_mode(gpt2_tokenizer):
    model = small("gpt2-124m", vocab_size=50257)
    pieces = zoo.generate(
        model, "Hello", tokenizer=gpt2_tokenizer, max_new_tokens=4, temperature=0, stream=True
    )
    for _ in pieces:
        assert not torch.is_inference_mode_enabled()
        assert not model.training
    assert not torch.is_inference_mode_enabled()


# -- the model/tokenizer pair --------------------------------------------------------------
class _Words:
    """A word-level test tokenizer over ``vocab_size`` ids: id i is the word ``w{i}``."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self.eos_id, self.bos_id, self.name = vocab_size, None, None, "words"

    def encode(self, text: str) -> list[int]:
        return [int(w[1:]) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


def test_a_padded_model_vocabulary_never_samples_ids_the_tokenizer_lacks():
    """nanoGPT pads 50257 to 50304: sampling id 50262 used to crash the decode."""
    model = small("gpt2-124m")  # vocab 1000
    with torch.no_grad():
        model.head.weight[900:] *= 50  # make the padded ids the most likely ones
    tok = _Words(900)
    text = zoo.generate(model, "w1 w2 w3", tokenizer=tok, max_new_tokens=20, temperature=0)
    assert all(int(w[1:]) < 900 for w in text.split())
    ids = zoo.generate(model, [1, 2, 3], tokenizer=tok, max_new_tokens=20, temperature=0)
    assert max(ids[3:]) < 900


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused():
    with pytest.raises(ValueError, match=r"tokenizer 'words' has 5000 ids .* vocabulary of 1000"):
        zoo.generate(small("gpt2-124m"), "w1 w2", tokenizer=_Words(5000), max_new_tokens=2)


def test_the_continuation_keeps_the_space_after_the_prompt():
    """WordPiece decodes each piece alone without its leading space: 'hello there' +
    'probation' became 'hello thereprobation'."""
    model = small("wiki-gpt-wordpiece", vocab_size=30522)
    tok = zoo.tokenizer("wiki-gpt-wordpiece")
    text = zoo.generate(model, "hello there", max_new_tokens=4, temperature=0)
    new = zoo.generate(model, tok.encode("hello there"), max_new_tokens=4, temperature=0)[2:]
    expected = tok.decode(tok.encode("hello there") + new)[len("hello there") :]
    assert text == expected and text.startswith(" ")
    streamed = "".join(
        zoo.generate(model, "hello there", max_new_tokens=4, temperature=0, stream=True)
    )
    assert streamed == text


def test_every_zoo_model_generates_by_recomputation_without_a_session():
    """The README's plugin model defines no start_decoding: zoo.runtime.start_decoding
    decodes it by recomputation."""
    from zoo.runtime import RecomputeSession, start_decoding

    model = small("toy-gpt-tiny")
    assert not hasattr(model, "start_decoding")
    assert type(start_decoding(model, torch.tensor([[3, 17]]), None, 2)) is RecomputeSession
    prompt = [3, 17, 42, 7]
    assert zoo.generate(model, prompt, max_new_tokens=8, temperature=0) == (
        greedy_by_recomputation(model, prompt, 8)
    )
    batch = zoo.generate(model, [prompt, [5, 6]], max_new_tokens=8, temperature=0)
    assert batch == [
        zoo.generate(model, prompt, max_new_tokens=8, temperature=0),
        zoo.generate(model, [5, 6], max_new_tokens=8, temperature=0),
    ]


class _Anything:
    """A tokenizer that encodes any string, lone surrogates included (as a careless one
    would): generate itself must refuse text that is not Unicode."""

    name, vocab_size, eos_id, bos_id = "anything", 1000, None, None

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.mark.parametrize(
    ("prompt", "stop", "message"),
    [
        ("Hello \udcff", None, r"the prompt holds a lone surrogate '\\udcff' at index 6"),
        (["ok", "\ud800"], None, r"prompt 1 holds a lone surrogate '\\ud800' at index 0"),
        ("Hello", ["\ud800"], r"stop string 0 holds a lone surrogate"),
    ],
)
def test_a_lone_surrogate_is_refused_at_generate(prompt, stop, message):
    with pytest.raises(ValueError, match=message):
        zoo.generate(small("gpt2-124m"), prompt, tokenizer=_Anything(), max_new_tokens=2, stop=stop)
