"""Fine-tuning Marian, BART and T5 with ``zoo train --task seq2seq``: zoo's batches are
transformers' (the source and labels its tokenizer makes, the decoder's input its
``shift_tokens_right`` makes from the family's ``decoder_start_token_id``, padding -100 in the
labels), one training step's loss and every gradient equal ``model(input_ids,
attention_mask, labels=...)``'s on the same batch and weights, and ``zoo train`` runs on a
folder end to end, whole and ``--lora`` (the adapter loads in peft with zoo's logits). The
folders are tiny random ones (:mod:`seq2seq_tiny`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from seq2seq_tiny import FAMILIES, hf_batch, pairs, reload, save_folder, write_pairs

import zoo
from zoo.checkpoint.readers import architecture
from zoo.checkpoint.write import hf_layouts
from zoo.cli import main
from zoo.train.data import IGNORE, PairData
from zoo.train.data_files import DataError
from zoo.train.task import DataRequest, task_of
from zoo.train.world import World

ROWS = pairs()
STARTS = {"marian": 98, "bart": 2, "t5": 0}  # each family's decoder_start_token_id


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(family, folder, transformers' tokenizer, a pairs file)."""
    root = tmp_path_factory.mktemp(request.param)
    _, tok = save_folder(request.param, root / "model")
    return request.param, root / "model", tok, write_pairs(root / "pairs.tsv", ROWS)


def _pairs_of(model: Any, data: Path, out: Path) -> PairData:
    world = World(0, 1, torch.device("cpu"))
    request = DataRequest(data, model.tokenizer, out, model.config.context_length, 0.25, world)
    source = task_of(model).read(model, request)
    assert isinstance(source, PairData)
    return source


def test_batches_are_transformers_batches(family, tmp_path):
    """With the start id from config.json (zoo's ``decoder_start_id``), as transformers'
    training reads it; a folder without ``generation_config.json`` frames them alike."""
    name, folder, tok, data = family
    ours = zoo.load(folder)
    assert ours.config.decoder_start_id == STARTS[name]
    picks = [0, 3, 5, 7, 11]
    inputs, labels = _pairs_of(ours, data, tmp_path).rows(picks)
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "generation_config.json").unlink()
    again = _pairs_of(zoo.load(bare), data, tmp_path).rows(picks)
    assert all(torch.equal(again[0][k], v) for k, v in inputs.items())
    want = hf_batch(tok, [ROWS[i] for i in picks])
    assert torch.equal(inputs["src_ids"], want["input_ids"])
    assert torch.equal(inputs["src_mask"], want["attention_mask"])
    assert torch.equal(labels, want["labels"])  # eos (and BART's <s>) as the tokenizer puts them
    decoder = reload(folder).prepare_decoder_input_ids_from_labels(labels=want["labels"])
    assert torch.equal(inputs["tgt_mask"], (labels != IGNORE).long())
    keep = inputs["tgt_mask"].bool()
    assert torch.equal(inputs["tgt_ids"][keep], decoder[keep])
    assert (inputs["tgt_ids"][:, 0] == STARTS[name]).all()
    assert (inputs["tgt_ids"][~keep] == tok.pad_token_id).all()


def _zoo_grads(model: Any) -> dict[str, torch.Tensor]:
    """The model's gradients under transformers' names (its checkpoint layout)."""
    arch = architecture(type(model.config).architecture, where="test", plugin=None)
    keymap = arch.checkpoint_layout(hf_layouts(arch)[0])
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return keymap.from_zoo(grads, model.config)[0]


def _their_grads(folder: Path, batch: dict[str, Any], *, padding_idx: bool) -> Any:
    """transformers' loss on ``batch`` and its gradients by name; without ``padding_idx``,
    its embeddings' padding rows get their gradient too."""
    theirs = reload(folder).train()
    for module in theirs.modules():
        if isinstance(module, torch.nn.Embedding) and not padding_idx:
            module.padding_idx = None
    loss = theirs(**batch).loss
    loss.backward()
    return loss, {n: p.grad for n, p in theirs.named_parameters() if p.requires_grad}


def test_one_step_loss_and_gradients_equal_transformers(family, tmp_path):
    """The task's loss and every gradient against transformers' on one batch. Marian's
    embedding has ``padding_idx`` = pad, which is its decoder's start: transformers gives that
    row no gradient from the lookups and zoo does, the one difference (with ``padding_idx``
    cleared, the row is equal too)."""
    name, folder, tok, data = family
    ours = zoo.load(folder).train()
    picks = [1, 2, 4, 8, 9, 13]
    inputs, labels = _pairs_of(ours, data, tmp_path).rows(picks)
    loss = task_of(ours).loss(ours, inputs, labels)
    loss.backward()
    batch = hf_batch(tok, [ROWS[i] for i in picks])
    their_loss, want = _their_grads(folder, batch, padding_idx=True)
    assert loss.item() == pytest.approx(their_loss.item(), rel=1e-6)
    got = _zoo_grads(ours)
    assert set(want) - set(got) <= {  # Marian's fixed position tables (no gradient)
        "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"
    }  # fmt: skip
    scale = max(float(g.abs().max()) for g in want.values())
    shared = "shared.weight" if name == "t5" else "model.shared.weight"
    for key in set(want) & set(got):
        ours_g, theirs_g = got[key], want[key]
        if key == shared and name == "marian":  # every row but the pad's
            ours_g, theirs_g = ours_g[:-1], theirs_g[:-1]
        torch.testing.assert_close(ours_g, theirs_g, rtol=1e-4, atol=1e-6 * scale)
    if name == "marian":
        assert float((got[shared][-1] - want[shared][-1]).abs().max()) > 1e-3 * scale
        _, cleared = _their_grads(folder, batch, padding_idx=False)
        torch.testing.assert_close(got[shared], cleared[shared], rtol=1e-4, atol=1e-6 * scale)


def _train(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Run ``zoo train ARGV`` in this process; the pairs of each batch it drew."""
    drawn: list[list[int]] = []
    rows = PairData.rows

    def recording(self: PairData, picks: list[int]) -> Any:
        drawn.append(list(picks))
        return rows(self, picks)

    monkeypatch.setattr(PairData, "rows", recording)
    assert main(["train", *argv]) == 0
    return drawn


FLAGS = ["--task", "seq2seq", "--steps", "2", "--batch-size", "4", "--warmup", "1",
         "--eval-every", "2", "--eval-batches", "1", "--val-fraction", "0.25"]  # fmt: skip


def _first_loss(out: Path) -> float:
    import json

    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["loss"]


def test_zoo_train_fine_tunes_a_folder(family, tmp_path, monkeypatch):
    """``zoo train --from FOLDER --task seq2seq``: the first step's loss is transformers' on
    the pairs the run drew, and the trained model loads with its tokenizer."""
    name, folder, tok, data = family
    out = tmp_path / "run"
    argv = ["--from", str(folder), "--data", str(data), "--out", str(out), *FLAGS]
    drawn = _train(argv, monkeypatch)
    with torch.no_grad():
        want = reload(folder).train()(**hf_batch(tok, [ROWS[i] for i in drawn[0]])).loss
    assert _first_loss(out) == pytest.approx(float(want), rel=1e-5)
    trained, base = zoo.load(out / "model"), zoo.load(folder)
    assert trained.config.decoder_start_id == STARTS[name]  # framed alike when trained again
    assert trained.tokenizer.encode("w1 w2", add_special_tokens=True) == tok("w1 w2").input_ids
    moved = [k for k, t in base.state_dict().items() if not torch.equal(t, trained.state_dict()[k])]
    assert "encoder.0.attn.qkv.weight" in moved


def test_zoo_train_lora_on_a_folder_loads_in_peft(family, tmp_path, monkeypatch):
    """``zoo train FOLDER --lora 4 --task seq2seq`` on the attention projections (self and
    cross): the first step's loss is the base's on the drawn pairs (a fresh adapter adds
    nothing), and the adapter it writes gives the same logits in peft as in zoo."""
    import peft

    _, folder, tok, data = family
    out = tmp_path / "run"
    targets = ["attn.qkv", "attn.proj", "cross_attn.q", "cross_attn.kv", "cross_attn.proj"]
    argv = [str(folder), "--lora", "4", "--lora-targets", *targets, "--lr", "0.01",
            "--data", str(data), "--out", str(out), *FLAGS]  # fmt: skip
    drawn = _train(argv, monkeypatch)
    with torch.no_grad():
        want = reload(folder).train()(**hf_batch(tok, [ROWS[i] for i in drawn[0]])).loss
    assert _first_loss(out) == pytest.approx(float(want), rel=1e-5)
    ours = zoo.load(folder, adapter=out / "adapter")
    theirs = peft.PeftModel.from_pretrained(reload(folder), out / "adapter").eval()
    batch = hf_batch(tok, ROWS[:5])
    decoder = reload(folder).prepare_decoder_input_ids_from_labels(labels=batch["labels"])
    keep = batch["labels"] != IGNORE
    with torch.no_grad():
        got = ours(batch["input_ids"], decoder, batch["attention_mask"], keep.long())
        base = zoo.load(folder)(batch["input_ids"], decoder, batch["attention_mask"], keep.long())
        peft_logits = theirs(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder,
        ).logits  # fmt: skip
    torch.testing.assert_close(got[keep], peft_logits[keep], rtol=1e-5, atol=1e-5)
    assert float((got - base)[keep].abs().max()) > 1e-4  # the adapter was trained


def test_seq2seq_is_refused_for_a_decoder(tmp_path, capsys):
    data = write_pairs(tmp_path / "pairs.tsv", ROWS)
    argv = ["train", "llama-tiny", "--task", "seq2seq", "--data", str(data),
            "--out", str(tmp_path / "run"), "--steps", "1"]  # fmt: skip
    assert main(argv) == 2
    assert "--task seq2seq trains an encoder-decoder" in capsys.readouterr().err


def test_pairs_need_the_ids_they_are_framed_with(family, tmp_path):
    """A tokenizer without a pad id, and a model that names no decoder start with a
    tokenizer without bos, are refused naming what is missing."""
    _, folder, _, data = family
    ours = zoo.load(folder)
    tokenizer = ours.tokenizer
    no_pad = type("NoPad", (), {"name": "nopad", "bos_id": 0, "eos_id": 1, "pad_id": None})
    with pytest.raises(DataError, match="has no pad id"):
        PairData.read(data, no_pad(), 64, 0.25, decoder_start=0)
    if tokenizer.bos_id is None:  # Marian's and T5's: the checkpoint's start is needed
        with pytest.raises(DataError, match=r"no bos .*names no decoder_start_token_id"):
            PairData.read(data, tokenizer, 64, 0.25)
