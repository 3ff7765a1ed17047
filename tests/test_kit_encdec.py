"""The conformance kit compares encoder-decoders with transformers (zoo.testing.reference_encdec):
``zoo check`` on Marian, BART, mBART and T5 (v1.1 and v1.0's tied, rescaled head) exports the
small random model to its Hugging Face layout, loads it in the class the layout names and
compares logits on a right-padded batch, greedy decoding and a beam search. Each planted bug
below leaves the model running and its own round trip intact; ``zoo check`` must fail on it,
with the reason. The named models without a bug pass (tests/test_conformance.py runs them),
and so do the folders here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo.testing
from zoo.cli import main
from zoo.testing import CHECKS, run_check
from zoo.testing.reference_encdec import (
    BUFFER_STD,
    EncoderDecoderReference,
    compare_encdec_with_reference,
    randomize_buffers,
)

transformers = pytest.importorskip("transformers")
EncoderDecoder = pytest.importorskip("zoo_plugins.transformer_encdec.model").EncoderDecoder
EncoderDecoderSession = pytest.importorskip(
    "zoo_plugins.transformer_encdec.model"
).EncoderDecoderSession
RelativePositionBias = pytest.importorskip("zoo_plugins.t5.positions").RelativePositionBias
SinusoidalHalves = pytest.importorskip("zoo_plugins.marian.positions").SinusoidalHalves

_STACKS = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
           "encoder_attention_heads": 4, "decoder_attention_heads": 4,
           "encoder_ffn_dim": 48, "decoder_ffn_dim": 48, "max_position_embeddings": 64}  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folders of the families no named model covers, as transformers saves them: mBART
    (pre-LN, a norm after each stack) and T5 v1.0 (ReLU, the head tied to the embedding and
    rescaled by ``d_model ** -0.5``). ``zoo check`` reads their configs, not their weights."""
    torch.manual_seed(0)
    models = {
        "mbart": transformers.MBartForConditionalGeneration(
            transformers.MBartConfig(vocab_size=120, scale_embedding=True, **_STACKS)
        ),
        "t5-tied": transformers.T5ForConditionalGeneration(
            transformers.T5Config(
                vocab_size=120, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                feed_forward_proj="relu", tie_word_embeddings=True, decoder_start_token_id=0,
            )
        ),
    }  # fmt: skip
    out = {}
    for name, model in models.items():
        out[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(out[name])
    return out


@pytest.fixture
def reference_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``zoo check`` runs the reference check alone (the others do not look at the seams
    planted here, and take most of the time)."""
    monkeypatch.setattr(zoo.testing, "CHECKS", {"reference": CHECKS["reference"]})


def zoo_check(source: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str]]:
    """``zoo check SOURCE --device cpu``: its exit code and each check's line."""
    code = main(["check", source, "--device", "cpu"])
    out = capsys.readouterr().out
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith(source)}
    return code, rows


# -- without a bug ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "cls"),
    [("mbart", "MBartForConditionalGeneration"), ("t5-tied", "T5ForConditionalGeneration")],
)
def test_a_folder_passes_against_its_transformers_class(
    folders: dict[str, Path], family: str, cls: str, capsys: Any, reference_only: None
) -> None:
    code, rows = zoo_check(str(folders[family]), capsys)
    assert code == 0, rows
    line = rows["reference"]
    assert " ok " in line and f"({cls})" in line
    assert "greedy tokens equal (16 per source" in line and "beam search (3 beams) equal" in line
    assert "stacks of 1 and 2 layers, logits only" in line  # the unequal depths, compared too
    assert "6 heads, 3 layers: stacks of 3 and 3 layers" in line  # the second draw
    assert "stacks of 2 and 3 layers, logits only" in line
    differences = [float(d) for d in re.findall(r"max logit difference ([0-9.e+-]+)", line)]
    assert len(differences) == 6 and max(differences) <= 1e-4  # 3 draws, 2 stacks each
    assert line.count("config survives transformers") == 6 and " moved: stacks of 2 and 2" in line


def test_named_models_report_what_was_compared() -> None:
    """The note says which class was run and that generation was compared (a T5: the
    depths that transformers' T5 can decode)."""
    note = run_check("flan-t5-small", "reference")
    assert note is not None
    assert note.startswith(
        "4 heads, 2 layers: stacks of 2 and 2 layers: hf-t5 (T5ForConditionalGeneration)"
    )
    assert "; 6 heads, 3 layers: stacks of 3 and 3 layers: hf-t5" in note
    assert "greedy tokens equal" in note and "beam search (3 beams) equal" in note


# -- planted bugs: zoo check fails ------------------------------------------------------------
def _no_logits_bias(monkeypatch: pytest.MonkeyPatch) -> None:
    """Marian's and BART's ``final_logits_bias`` left out of the logits."""
    real = EncoderDecoder.decoder_head

    def head(self: Any, x: torch.Tensor) -> torch.Tensor:
        logits = real(self, x)
        bias = self.final_logits_bias
        return logits if bias is None else logits - bias

    monkeypatch.setattr(EncoderDecoder, "decoder_head", head)


def _interleaved_sinusoids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Marian's table laid out as zoo's ``sinusoidal`` lays it out: sin, cos, sin, cos..."""
    real = SinusoidalHalves.embed

    def embed(self: Any, position_ids: torch.Tensor) -> torch.Tensor:
        halves, half = real(self, position_ids), (self.d_model + 1) // 2
        return torch.stack((halves[..., :half], halves[..., half:]), dim=-1).flatten(-2)

    monkeypatch.setattr(SinusoidalHalves, "embed", embed)


def _position_offset_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """BART's learned positions read from row ``p + 3``, not ``p + 2``."""
    real = EncoderDecoder.embed

    def embed(self: Any, ids: torch.Tensor, positions: torch.Tensor, *, source: bool = False):
        shift = 1 if self.config.position_offset else 0
        return real(self, ids, positions + shift, source=source)

    monkeypatch.setattr(EncoderDecoder, "embed", embed)


def _no_encoder_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    """mBART's norm after the encoder's last layer skipped."""
    real = EncoderDecoder._encode

    def encode(self: Any, src_ids: torch.Tensor, src_keep: Any) -> torch.Tensor:
        norm, self.encoder_norm = self.encoder_norm, None
        try:
            return real(self, src_ids, src_keep)
        finally:
            self.encoder_norm = norm

    monkeypatch.setattr(EncoderDecoder, "_encode", encode)


def _unscaled_tied_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """T5 v1.0's tied head without its ``d_model ** -0.5`` rescaling."""
    real = EncoderDecoder.decoder_head

    def head(self: Any, x: torch.Tensor) -> torch.Tensor:
        logits = real(self, x)
        return logits * self.config.d_model**0.5 if self.config.scale_decoder_output else logits

    monkeypatch.setattr(EncoderDecoder, "decoder_head", head)


def _causal_encoder_bias(monkeypatch: pytest.MonkeyPatch) -> None:
    """T5's encoder given the decoder's one-sided relative buckets."""
    monkeypatch.setattr(
        RelativePositionBias, "bidirectional_score_bias", RelativePositionBias.score_bias
    )


def _decoding_ignores_source_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoding session's cross-attention reads the source's padding (forward is right:
    only generation is wrong)."""
    real = EncoderDecoderSession.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        self.src_keep = None

    monkeypatch.setattr(EncoderDecoderSession, "__init__", init)


def _beams_never_reordered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A beam search that never reorders the session's rows after its beams (greedy
    decoding and the logits are right)."""
    import zoo.generation.beam

    monkeypatch.setattr(zoo.generation.beam, "reorder_rows", lambda session, origin: None)


LOGITS = "logits differ from the reference's"
PLANTED = {
    "marian-no-logits-bias": ("opus-mt-en-de", _no_logits_bias, LOGITS),
    "marian-interleaved-sinusoids": ("opus-mt-tr-en", _interleaved_sinusoids, LOGITS),
    "bart-position-offset": ("bart-large-cnn", _position_offset_off_by_one, LOGITS),
    "mbart-no-encoder-norm": ("mbart", _no_encoder_norm, LOGITS),
    "t5-tied-head-unscaled": ("t5-tied", _unscaled_tied_head, LOGITS),
    "t5-causal-encoder-bias": ("flan-t5-small", _causal_encoder_bias, LOGITS),
    # a Marian that repeats one token: the step logits still see it
    "decoding-ignores-source-padding": (
        "opus-mt-en-de", _decoding_ignores_source_padding, "the decoding session's logits differ"
    ),
    "beams-never-reordered": ("flan-t5-small", _beams_never_reordered, "beam search (3 beams"),
}  # fmt: skip


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_zoo_check_fails_on_a_planted_bug(
    bug: str, folders: dict[str, Path], monkeypatch: Any, capsys: Any, reference_only: None
) -> None:
    source, plant, message = PLANTED[bug]
    source = str(folders[source]) if source in folders else source
    plant(monkeypatch)
    code, rows = zoo_check(source, capsys)
    assert code == 1, rows
    assert " FAILED " in rows["reference"] and message in rows["reference"], rows["reference"]


def test_the_whole_zoo_check_fails_on_a_missing_logits_bias(monkeypatch: Any, capsys: Any) -> None:
    """Every check, as a user runs it: only the reference check sees the missing bias."""
    _no_logits_bias(monkeypatch)
    code, rows = zoo_check("bart-large-cnn", capsys)
    assert code == 1
    failed = {check for check, line in rows.items() if " FAILED " in line}
    assert failed == {"reference"}, rows
    assert "hf-bart: logits differ from the reference's by" in rows["reference"]


# -- the pieces ------------------------------------------------------------------------------
def test_the_buffers_saved_with_the_weights_are_drawn() -> None:
    """A fresh model's logits bias is zero, so a model that drops it would pass: the kit
    draws it (and leaves buffers that are not saved alone)."""
    model = torch.nn.Module()
    model.register_buffer("final_logits_bias", torch.zeros(2000))
    model.register_buffer("scratch", torch.zeros(4), persistent=False)
    randomize_buffers(model, seed=0)
    assert abs(float(model.final_logits_bias.std()) - BUFFER_STD) < 0.01
    assert torch.equal(model.scratch, torch.zeros(4))


def test_generation_compared_with_its_settings_neutral(tmp_path: Path) -> None:
    """A folder whose config.json asks transformers for a forced end and banned words: the
    kit overrides them on transformers' side as zoo decodes without them (an exported
    generation_config.json or config.json would otherwise change only one side)."""
    zoo_model = zoo.build("opus-mt-en-de", **zoo.testing.small_overrides("opus-mt-en-de")).eval()
    zoo.testing.reference.randomize_parameters(zoo_model)
    zoo.export(zoo_model, tmp_path, "hf-marian")
    theirs = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    theirs.generation_config.forced_eos_token_id = 5
    theirs.generation_config.bad_words_ids = [[7]]
    theirs.generation_config.no_repeat_ngram_size = 2
    note = compare_encdec_with_reference(
        zoo_model, EncoderDecoderReference(theirs), start=zoo_model.config.decoder_start_id
    )
    assert "beam search (3 beams) equal" in note
