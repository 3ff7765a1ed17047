"""Beam search and the constraints on each pick, token for token against transformers'
``generate`` on the same weights: a tiny random GPT-2 that ``save_pretrained`` wrote and
``zoo.load`` read, on a batch with a left-padded row, for 1 to 5 beams with and without n-gram
blocking, every ``length_penalty`` sign and ``early_stopping`` value, several returned
sequences, two end ids, bad words, ``min_new_tokens``, ``min_length`` and forced first and
last tokens. The end id is the token the model picks most (so hypotheses do end), and each
setting is checked to change the output where it should (a test that cannot fail proves
nothing). Also: a checkpoint's ``generation_config.json`` as the defaults, the encoder-decoder
(a cached beam search against one that recomputes every step), a Marian folder against
transformers when that family is installed, the sessions' row reordering, the refusals and
``zoo generate --num-beams``."""

from __future__ import annotations

import itertools
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
from zoo.errors import CheckpointError, ConfigError
from zoo.generation import GenerationConfig, generate_ids
from zoo.runtime import (
    DecoderSession,
    RecomputeSession,
    StaticDecoderSession,
    reorder_rows,
)
from zoo.testing import small_overrides

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

#: A batch of two prompts, the second left-padded by two (pad id 0, as zoo pads).
IDS = torch.tensor([[5, 80, 3, 250, 17, 9], [0, 0, 44, 45, 46, 47]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])


def _lively(model: torch.nn.Module, std: float = 1.0, seed: int = 0) -> None:
    """Weight matrices drawn from N(0, std): at 1 a tiny random model does not repeat one
    token; at 0.1 its next-token distribution is flat enough that beams disagree."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, int, Path]:
    """transformers' GPT-2, zoo's load of the folder it saved, the end id (the token greedy
    decoding picks most) and the folder."""
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=64, n_head=4, n_layer=2, n_positions=64, vocab_size=300,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config).eval()
    _lively(hf, std=0.1)
    hf.save_pretrained(folder)
    model = zoo.load(folder)
    greedy = generate_ids(model, IDS, MASK, GenerationConfig(max_new_tokens=30, temperature=0))
    eos = Counter(greedy[:, 6:].flatten().tolist()).most_common(1)[0][0]
    return hf, model, eos, folder


def _both(pair: tuple[Any, Any, int, Path], ends: tuple[int, ...] = (), **settings: Any) -> Any:
    """transformers' and zoo's ids for :data:`IDS` with ``settings`` (transformers' names),
    end ids ``ends`` (default: the fixture's), rows that end early filled with the first."""
    hf, model, eos, _ = pair
    ends = ends or (eos,)
    settings = {"max_new_tokens": 12, **settings}
    want = hf.generate(
        IDS, attention_mask=MASK, do_sample=False, eos_token_id=list(ends), pad_token_id=ends[0],
        **settings,
    )  # fmt: skip
    names = {"forced_bos_token_id": "forced_bos_id", "forced_eos_token_id": "forced_eos_id"}
    ours = {names.get(k, k): v for k, v in settings.items()}
    config = GenerationConfig(temperature=0, eos_id=ends[0], stop_ids=ends[1:], **ours)
    return want, generate_ids(model, IDS, MASK, config)


@pytest.mark.parametrize("ngram", [0, 2])
@pytest.mark.parametrize("beams", [1, 2, 3, 4, 5])
def test_beams_1_to_5_equal_transformers(pair, beams: int, ngram: int) -> None:
    want, ours = _both(pair, num_beams=beams, no_repeat_ngram_size=ngram)
    assert torch.equal(ours, want)


def test_the_beam_count_and_the_blocking_change_the_output(pair) -> None:
    """What the parity above covers is not one output ten times over."""
    _, model, eos, _ = pair
    outputs = {
        (beams, ngram): tuple(generate_ids(model, IDS, MASK, GenerationConfig(
            temperature=0, eos_id=eos, max_new_tokens=12, num_beams=beams,
            no_repeat_ngram_size=ngram,
        )).flatten().tolist())
        for beams, ngram in itertools.product(range(1, 6), [0, 2])
    }  # fmt: skip
    assert len(set(outputs.values())) >= 8
    assert all(outputs[beams, 0] != outputs[1, 0] for beams in range(2, 6))


def test_length_penalty_and_early_stopping_equal_transformers(pair) -> None:
    seen = set()
    for penalty, stopping in itertools.product([1.0, 2.0, -1.0, 0.0], [False, True, "never"]):
        want, ours = _both(pair, num_beams=4, length_penalty=penalty, early_stopping=stopping)
        assert torch.equal(ours, want), (penalty, stopping)
        seen.add(tuple(ours.flatten().tolist()))
    assert len(seen) >= 3, "the settings changed nothing: the end id is never reached"


@pytest.mark.parametrize("ends", [(), "two"])
def test_returned_sequences_and_two_end_ids_equal_transformers(pair, ends) -> None:
    ends = (pair[2], 67) if ends == "two" else ()
    want, ours = _both(pair, ends, num_beams=4, num_return_sequences=3, length_penalty=0.5)
    assert ours.shape[0] == 6 and torch.equal(ours, want)


def test_a_padded_batch_gives_what_each_prompt_gives_alone(pair) -> None:
    _, model, eos, _ = pair
    config = GenerationConfig(temperature=0, eos_id=eos, num_beams=3, num_return_sequences=2)
    together = generate_ids(model, IDS, MASK, config)
    for row, prompt in enumerate([IDS[0], IDS[1, 2:]]):
        alone = generate_ids(model, prompt[None], None, config)
        n = alone.shape[1] - len(prompt)
        rows = together[2 * row : 2 * row + 2, 6 : 6 + n]
        assert torch.equal(rows, alone[:, len(prompt) :]), row


def _constraint(name: str, free: torch.Tensor, eos: int) -> dict[str, Any]:
    """transformers' settings of constraint ``name``, made to bite on ``free``, the output
    without it: its own tokens banned, an end id forced where it did not end..."""
    new = free[0, 6:].tolist()
    other = next(i for i in range(3, 300) if i not in (eos, new[-1]))
    ended = [row.index(eos) for row in free[:, 6:].tolist() if eos in row]
    assert ended, "no row ends: the end-id constraints would prove nothing"
    return {
        "bad-words": {"bad_words_ids": [[new[0]], new[1:3], new[3:6]]},
        "bad-word-is-the-end-id": {"bad_words_ids": [[eos]]},  # dropped, as transformers does
        "min-new-tokens": {"min_new_tokens": min(ended) + 1},
        "min-length": {"min_length": 6 + min(ended) + 1},  # the prompt counts
        "forced-eos": {"forced_eos_token_id": other},
        "forced-eos-ids": {"forced_eos_token_id": [other, other + 1]},
        "no-repeat-unigram": {"no_repeat_ngram_size": 1},
    }[name]


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize(
    "name",
    ["bad-words", "bad-word-is-the-end-id", "min-new-tokens", "min-length", "forced-eos",
     "forced-eos-ids", "no-repeat-unigram"],
)  # fmt: skip
def test_constraints_equal_transformers(pair, name: str, beams: int) -> None:
    _, free = _both(pair, num_beams=beams)
    want, ours = _both(pair, num_beams=beams, **_constraint(name, free, pair[2]))
    assert torch.equal(ours, want)
    if name == "bad-word-is-the-end-id":
        assert torch.equal(ours, free)
    else:
        assert not torch.equal(ours, free), f"{name} changed nothing here"


@pytest.mark.parametrize("beams", [1, 3])
def test_forced_first_token_equals_transformers(pair, beams: int) -> None:
    hf, model, eos, _ = pair
    one = torch.tensor([[5], [44]])  # a one-token prefix: the next token is the first forced
    want = hf.generate(
        one, attention_mask=torch.ones_like(one), do_sample=False, eos_token_id=eos,
        pad_token_id=eos, max_new_tokens=6, num_beams=beams, forced_bos_token_id=77,
    )  # fmt: skip
    config = GenerationConfig(
        temperature=0, eos_id=eos, max_new_tokens=6, num_beams=beams, forced_bos_id=77
    )
    ours = generate_ids(model, one, None, config)
    assert torch.equal(ours, want) and (ours[:, 1] == 77).all()


def test_zoo_generate_takes_ids_padded_on_either_side_and_lists(pair) -> None:
    _, model, _, _ = pair
    kwargs = {"max_new_tokens": 8, "num_beams": 3, "no_repeat_ngram_size": 2}
    left = zoo.generate(model, IDS, attention_mask=MASK, **kwargs)
    right = torch.tensor([[5, 80, 3, 250, 17, 9], [44, 45, 46, 47, 0, 0]])
    assert torch.equal(zoo.generate(model, right, attention_mask=MASK.flip(1), **kwargs), left)
    lists = [IDS[0].tolist(), [44, 45, 46, 47]]
    rows = zoo.generate(model, lists, num_return_sequences=2, **kwargs)
    tensor = zoo.generate(model, IDS, attention_mask=MASK, num_return_sequences=2, **kwargs)
    assert rows[0] == tensor[0].tolist() and rows[2] == [44, 45, 46, 47, *tensor[2, 6:].tolist()]
    assert len(rows) == 4


def test_generation_config_json_gives_the_defaults(pair, tmp_path: Path) -> None:
    folder = pair[3]
    shutil.copytree(folder, tmp_path / "m")
    values = {"num_beams": 3, "no_repeat_ngram_size": 2, "length_penalty": 0.5,
              "num_return_sequences": 2, "min_new_tokens": 3, "eos_token_id": 2,
              "max_length": 9, "do_sample": False, "transformers_version": "5.0"}  # fmt: skip
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(values))
    model = zoo.load(tmp_path / "m")
    assert model.generation_config.num_beams == 3 and model.generation_config.max_length == 9
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m").eval()
    want = theirs.generate(IDS, attention_mask=MASK, max_new_tokens=10, eos_token_id=None)
    # a decoder's max_length counts its prompt and is not read: max_new_tokens is given
    assert torch.equal(zoo.generate(model, IDS, attention_mask=MASK, max_new_tokens=10), want)
    assert want.shape[0] == 4  # two sequences per prompt: the file's
    greedy = zoo.generate(model, IDS, attention_mask=MASK, max_new_tokens=10, num_beams=1,
                          num_return_sequences=1, temperature=0)  # fmt: skip
    assert torch.equal(greedy, theirs.generate(IDS, attention_mask=MASK, max_new_tokens=10,
                                               num_beams=1, num_return_sequences=1))  # fmt: skip


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"num_beams": 0}, "num_beams must be at least 1"),
        ({"early_stopping": "sometimes"}, "early_stopping"),
        ({"bad_words_ids": [3]}, "bad_words_ids"),
        ({"forced_eos_token_id": -1}, "forced_eos_token_id"),
    ],
)
def test_a_bad_generation_config_json_is_refused_by_key(pair, tmp_path, values, message) -> None:
    shutil.copytree(pair[3], tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(values))
    with pytest.raises(CheckpointError, match=rf"generation_config.json.*{message}"):
        zoo.load(tmp_path / "m")


# -- encoder-decoders ---------------------------------------------------------------------
class _Recomputed:
    """An encoder-decoder session with no cache: the whole target run again every step; its
    rows reordered by :func:`reorder_rows`' generic path (it has no ``reorder``)."""

    def __init__(self, model: Any, src: torch.Tensor, keep: Any, start_id: int) -> None:
        self.model, self.src, self.src_keep = model, src, keep
        self.prefix = torch.full((src.shape[0], 1), start_id, dtype=torch.long)
        self.target = self.prefix

    def _logits(self) -> torch.Tensor:
        return self.model(self.src, self.target, src_mask=self.src_keep)[:, -1]

    def prefill(self) -> torch.Tensor:
        return self._logits()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.target = torch.cat([self.target, tokens[:, None]], dim=1)
        return self._logits()


@pytest.mark.parametrize("beams", [2, 4])
def test_encoder_decoder_beam_search_equals_recomputation(monkeypatch, beams: int) -> None:
    torch.manual_seed(0)
    model = zoo.build("transformer-encdec", **small_overrides("transformer-encdec")).eval()
    _lively(model)
    src = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13]])
    keep = src != 0
    config = GenerationConfig(
        temperature=0, start_id=1, eos_id=3, max_new_tokens=10, num_beams=beams,
        num_return_sequences=2, no_repeat_ngram_size=2,
    )  # fmt: skip
    cached = generate_ids(model, src, keep, config)
    greedy = generate_ids(model, src, keep, GenerationConfig(temperature=0, start_id=1, eos_id=3,
                                                            max_new_tokens=10))  # fmt: skip
    monkeypatch.setattr(
        model, "start_decoding", lambda s, k, n, start_id: _Recomputed(model, s, k, start_id)
    )
    assert torch.equal(cached, generate_ids(model, src, keep, config))
    assert cached[:, 0].eq(1).all() and not torch.equal(cached[::2], greedy)


def test_marian_beam_search_equals_transformers(tmp_path: Path) -> None:
    """A Marian folder (transformers' MarianMTModel, a right-padded batch of sources) with
    the generation_config.json an OPUS-MT checkpoint carries: its defaults, then each beam
    count with and without n-gram blocking."""
    pytest.importorskip("zoo_plugins.marian")
    config = transformers.MarianConfig(
        vocab_size=120, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=119,
        decoder_start_token_id=119, eos_token_id=0, bos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(config).eval()
    _lively(hf)
    hf.save_pretrained(tmp_path)
    defaults = {"bad_words_ids": [[119]], "decoder_start_token_id": 119, "eos_token_id": 0,
                "forced_eos_token_id": 0, "max_length": 16, "num_beams": 4,
                "pad_token_id": 119}  # fmt: skip
    (tmp_path / "generation_config.json").write_text(json.dumps(defaults))
    hf = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    model = zoo.load(tmp_path)
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 0], [11, 12, 13, 0, 119, 119, 119]])
    mask = (src != 119).long()
    want = hf.generate(src, attention_mask=mask, pad_token_id=0)  # zoo fills with the end id
    assert torch.equal(zoo.generate(model, src, attention_mask=mask), want)
    assert want.shape[1] == 16 and (want[:, -1] == 0).all()  # max_length, the forced end
    for beams, ngram in itertools.product([1, 2, 3, 5], [0, 2]):
        kw = {"num_beams": beams, "no_repeat_ngram_size": ngram, "max_new_tokens": 10}
        want = hf.generate(src, attention_mask=mask, pad_token_id=0, **kw)
        assert torch.equal(zoo.generate(model, src, attention_mask=mask, temperature=0, **kw),
                           want), kw  # fmt: skip


# -- the sessions' rows -------------------------------------------------------------------
def _history_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    session = RecomputeSession(model, ids, None, 1)
    return session.prefill()


def test_each_session_reorders_its_rows_as_recomputation_would() -> None:
    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", **small_overrides("gpt2-124m")).eval()
    ids = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    index = torch.tensor([2, 2, 0])
    steps = [torch.tensor([20, 21, 22]), torch.tensor([23, 24, 25])]
    history = torch.cat([ids, steps[0][:, None]], 1)[index]
    history = torch.cat([history, steps[1][:, None]], 1)
    want = _history_logits(model, history)
    with torch.inference_mode():
        for session in (
            DecoderSession(model, ids, None, 8),
            StaticDecoderSession(model, ids, None, 8, record=False),
            RecomputeSession(model, ids, None, 5),
        ):
            session.prefill()
            session.step(steps[0])
            reorder_rows(session, index)
            got = session.step(steps[1])
            assert torch.allclose(got, want, atol=1e-5), type(session).__name__


class _Opaque:
    def __init__(self) -> None:
        self.prefix = torch.zeros(2, 1, dtype=torch.long)
        self.state = object()


def test_a_session_that_cannot_reorder_says_which_attribute() -> None:
    with pytest.raises(NotImplementedError, match=r"'state' holds a object.*reorder\(index\)"):
        reorder_rows(_Opaque(), torch.tensor([1, 0]))


# -- refusals and the command line ---------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"num_beams": 3, "seed": 1}, "takes no seed=1"),
        ({"num_beams": 3, "top_k": 5, "temperature": 0.7}, "temperature=0.7, top_k=5"),
        ({"num_beams": 3, "stop": "x"}, "stop="),
        ({"num_beams": 2, "num_return_sequences": 3}, "from 1 to num_beams"),
        ({"num_beams": 0}, "num_beams must be a positive"),
        ({"bad_words_ids": [[]]}, "bad_words_ids must be"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be"),
        ({"early_stopping": "soon"}, "early_stopping"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GenerationConfig(**settings)


def test_beam_search_neither_streams_nor_returns_several_from_one_prompt(pair) -> None:
    _, model, _, _ = pair
    with pytest.raises(ValueError, match="does not stream"):
        zoo.generation.stream_ids(model, IDS, MASK, GenerationConfig(num_beams=2))
    with pytest.raises(ValueError, match=r"batch of one \(\[ids\]\)"):
        zoo.generate(model, [1, 2, 3], num_beams=2, num_return_sequences=2)
    with pytest.raises(ValueError, match="bad_words_ids holds ids outside"):
        zoo.generate(model, [1, 2, 3], bad_words_ids=[[300]], temperature=0)


def test_zoo_generate_num_beams(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zoo.cli import main

    torch.manual_seed(0)
    model = zoo.build("shakespeare-byte", n_layers=1, d_model=32, n_heads=2, d_ff=64)
    _lively(model)
    zoo.save(model, tmp_path / "m")
    model = zoo.load(tmp_path / "m")
    settings = {"max_new_tokens": 6, "num_beams": 3, "no_repeat_ngram_size": 2}
    text = zoo.generate(model, "Hello", **settings)
    assert text != zoo.generate(model, "Hello", max_new_tokens=6, temperature=0)
    flags = ["--max-new-tokens", "6", "--num-beams", "3", "--no-repeat-ngram-size", "2"]
    assert main(["generate", str(tmp_path / "m"), "Hello", *flags]) == 0
    assert capsys.readouterr().out == f"Hello{text}\n"
    (tmp_path / "m" / "generation_config.json").write_text('{"num_beams": 3}')
    assert main(["generate", str(tmp_path / "m"), "Hello", "--max-new-tokens", "6"]) == 0
    beams = zoo.generate(model, "Hello", max_new_tokens=6, num_beams=3)
    assert capsys.readouterr().out == f"Hello{beams}\n"


def test_zoo_generate_refuses_bad_beam_flags_before_torch(tmp_path: Path) -> None:
    from cli_probe import refused_before_torch

    big, gen = str(2**62), ["generate", "shakespeare-byte", "hi"]
    refused_before_torch(
        tmp_path,
        [
            ([*gen, "--num-beams", big], "--num-beams must be at most 65,536"),
            ([*gen, "--no-repeat-ngram-size", big], "--no-repeat-ngram-size must be at most"),
            ([*gen, "--min-new-tokens", big], "--min-new-tokens must be at most"),
            ([*gen, "--num-beams", "0"], "num_beams must be a positive integer"),
            ([*gen, "--num-beams", "2", "--seed", "1"], "takes no seed=1"),
            ([*gen, "--length-penalty", "nan"], "length_penalty must be a finite number"),
        ],
        stub=True,
    )
