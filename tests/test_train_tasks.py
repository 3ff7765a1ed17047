"""Training's one shape: every task (decoder LM, classifier, encoder-decoder, a plugin's) runs
through the same loop from its TaskSpec; losses, files and log lines are those recorded on the
loop before the specs; FSDP2 shards the classifier's and the encoder-decoder's blocks, and two
gloo processes equal one."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import zoo
from zoo.errors import ConfigError
from zoo.tokenizers import SubwordBPE
from zoo.train import TrainConfig, classifier, labels_in, train
from zoo.train.task import TASKS, DataRequest, TaskSpec, task_of, token_loss

WORDS = "the quick brown fox jumps over a lazy dog and then runs far into the green wood"
TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "context_length": 32}
ENCDEC = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 2, "n_decoder_layers": 2}
CONFIG = TrainConfig(
    steps=6, batch_size=8, grad_accum=2, lr=3e-3, min_lr=3e-4, warmup=2, eval_every=3,
    eval_batches=2,
)  # fmt: skip


def _paths(root: Path) -> dict[str, Path]:
    """Each task's data file in ``root``."""
    names = {"causal-lm": "text.txt", "classify": "labelled.tsv", "seq2seq": "reverse.tsv"}
    return {task: root / name for task, name in names.items()}


def _data(root: Path) -> dict[str, Path]:
    """A text corpus, labelled texts and reversal pairs (the recording's data)."""
    rng = random.Random(0)
    paths = _paths(root)
    corpus = paths["causal-lm"]
    lines = [" ".join(rng.choice(WORDS.split()) for _ in range(10)) + "." for _ in range(400)]
    corpus.write_text("\n".join(lines))
    rng = random.Random(1)
    rows = []
    for i in range(200):
        label = "pos" if i % 2 else "neg"
        cue = rng.choice(
            ["green wood", "quick fox"] if label == "pos" else ["lazy dog", "runs far"]
        )
        words = [rng.choice(WORDS.split()[:6]) for _ in range(4)]
        words.insert(rng.randint(0, 4), cue)
        rows.append(f"{' '.join(words)}\t{label}")
    paths["classify"].write_text("\n".join(rows))
    pairs = []
    for _ in range(200):
        word = [rng.choice("abcdefgh") for _ in range(rng.randint(2, 5))]
        pairs.append(" ".join(word) + "\t" + " ".join(reversed(word)))
    paths["seq2seq"].write_text("\n".join(pairs))
    return paths


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return _data(tmp_path_factory.mktemp("tasks"))


def _model(
    task: str, data: dict[str, Path], dropout: float = 0.1
) -> tuple[zoo.ZooModel, SubwordBPE]:
    """The recording's model of ``task`` (seed 0) and its tokenizer."""
    if task == "seq2seq":
        tok = SubwordBPE.train([data[task].read_text()], 270)
        torch.manual_seed(0)
        model = zoo.build(
            "transformer-encdec-tiny", vocab_size=tok.vocab_size, context_length=16,
            dropout=dropout, **ENCDEC,
        )  # fmt: skip
        return model, tok
    tok = SubwordBPE.train([data["causal-lm"].read_text()], 300)
    torch.manual_seed(0)
    if task == "causal-lm":
        return zoo.build("gpt2-124m", **TINY, vocab_size=300, dropout=dropout), tok
    body = zoo.build("gpt2-124m", **TINY, vocab_size=300, dropout=0.0)
    return classifier(body, labels_in(data[task])), tok


# Recorded on the loop before the task specs (commit b8be3d6), float.hex of each loss: the same
# seed gives the same losses, held-out loss and log lines. Exact on the recording machine; other
# CPUs may round float32 kernels differently, hence the 1e-6 relative tolerance.
RECORDED = {
    "causal-lm": (
        ["0x1.6c6f9ap+2", "0x1.645c3fp+2", "0x1.574870p+2", "0x1.4d6e4fp+2", "0x1.45489dp+2",
         "0x1.40f295p+2"],
        "0x1.3ea2b0p+2",
        ["step 3: loss 5.3638, val 5.2127", "step 6: loss 5.0148, val 4.9787"],
    ),
    "classify": (
        ["0x1.273288p-1", "0x1.2c2adep+0", "0x1.be8997p-1", "0x1.9322b4p-1", "0x1.363a4ep-1",
         "0x1.ab97bep-2"],
        "0x1.e72278p-2",
        ["step 3: loss 0.8721, val 0.5072", "step 6: loss 0.4176, val 0.4757"],
    ),
    "seq2seq": (
        ["0x1.65283bp+2", "0x1.621dc2p+2", "0x1.599c26p+2", "0x1.513b0ap+2", "0x1.491897p+2",
         "0x1.45b358p+2"],
        "0x1.3e4a6fp+2",
        ["step 3: loss 5.4002, val 5.2016", "step 6: loss 5.0891, val 4.9733"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("task", sorted(RECORDED))
def test_each_task_gives_the_losses_recorded_before_the_specs(task, data, tmp_path):
    model, tok = _model(task, data)
    assert task_of(model) is TASKS[task]
    lines: list[str] = []
    out = tmp_path / "run"
    result = train(model, data[task], out, config=CONFIG, tokenizer=tok, log=lines.append)
    losses, val, logged = RECORDED[task]
    assert result.losses == pytest.approx([float.fromhex(x) for x in losses], rel=1e-6, abs=0)
    assert result.val_loss == pytest.approx(float.fromhex(val), rel=1e-6, abs=0)
    assert lines == logged and result.steps == 6 and result.stopped == "steps"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["loss"] for m in metrics] == result.losses
    assert [m["step"] for m in metrics if "val_loss" in m] == [3, 6]
    assert (out / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "checkpoint" / "trainer.json").is_file()
    loaded = zoo.load(out / "model")
    for key, value in result.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_models_declare_their_task_and_undeclared_ones_default():
    decoder = zoo.build("gpt2-124m", **TINY, vocab_size=300)
    assert task_of(decoder).name == "causal-lm"  # DecoderLM declares nothing
    assert task_of(classifier(decoder, ["a", "b"])).name == "classify"
    encdec = zoo.build("transformer-encdec-tiny", vocab_size=270, **ENCDEC)
    assert task_of(encdec).name == "seq2seq"

    class Undeclared(torch.nn.Module):  # a plugin's model that only says what it is
        is_encoder_decoder = True

    assert task_of(Undeclared()).name == "seq2seq"  # type: ignore[arg-type]
    Undeclared.is_encoder_decoder = False
    assert task_of(Undeclared()).name == "causal-lm"  # type: ignore[arg-type]


def test_an_unknown_task_name_says_which_exist():
    model = zoo.build("gpt2-124m", **TINY, vocab_size=300)
    model.train_task = "translate"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"'translate'.*causal-lm, chat, classify, seq2seq"):
        task_of(model)


def test_the_units_fsdp_shards_are_every_block():
    decoder = zoo.build("gpt2-124m", **TINY, vocab_size=300)
    assert TASKS["causal-lm"].units(decoder) == list(decoder.blocks)
    head = classifier(decoder, ["a", "b"])
    assert TASKS["classify"].units(head) == list(head.body.blocks)
    encdec = zoo.build("transformer-encdec-tiny", vocab_size=270, **ENCDEC)
    units = TASKS["seq2seq"].units(encdec)
    assert units == [*encdec.encoder, *encdec.decoder] and len(units) == 4


def test_a_model_brings_its_own_task_spec(data, tmp_path):
    """A plugin adds a task by declaring a TaskSpec: the loop reads its data and takes its
    loss (here: the text task with the loss counted and doubled)."""
    calls = {"read": 0, "loss": 0}
    text = TASKS["causal-lm"]

    def read(model, request: DataRequest):
        calls["read"] += 1
        assert request.context == 32 and request.out == tmp_path / "run"
        return text.read(model, request)

    def doubled(model, inputs, targets):
        calls["loss"] += 1
        return 2 * token_loss(model, inputs, targets)

    model, tok = _model("causal-lm", data)
    model.train_task = TaskSpec("doubled", read=read, units=text.units, loss=doubled)  # type: ignore[attr-defined]
    config = TrainConfig(steps=2, batch_size=4, warmup=1, eval_every=0, eval_batches=1)
    result = train(
        model, data["causal-lm"], tmp_path / "run", config=config, tokenizer=tok, log=None
    )
    assert calls == {"read": 1, "loss": 2 + 1}  # two steps, one evaluation batch
    model, _ = _model("causal-lm", data)
    plain = train(
        model, data["causal-lm"], tmp_path / "plain", config=config, tokenizer=tok, log=None
    )
    assert result.losses[0] == pytest.approx(2 * plain.losses[0], rel=1e-6)


WORKER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    sys.path.insert(0, sys.argv[4])
    from torch.distributed.fsdp import FSDPModule
    from test_train_tasks import _model, _paths
    from zoo.train import TrainConfig, train

    task, out, strategy = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    data = _paths(Path(sys.argv[5]))
    model, tok = _model(task, data, dropout=0.0)  # the ranks would draw different masks
    config = TrainConfig(steps=4, batch_size=8, lr=3e-3, warmup=1, eval_every=0, eval_batches=2)
    result = train(model, data[task], out, config=config, tokenizer=tok, log=None,
                   strategy=strategy)
    if os.environ.get("RANK", "0") == "0":
        sharded = [n for n, m in result.model.named_modules() if isinstance(m, FSDPModule)]
        (out / "sharded.json").write_text(json.dumps(sharded))
    """
)


@pytest.mark.slow  # three processes per task start torch and train: ~30 s each
@pytest.mark.parametrize("task", ["classify", "seq2seq"])
def test_fsdp_shards_the_blocks_and_two_gloo_processes_equal_one(task, tmp_path):
    """FSDP2 over 2 gloo processes (global batch 8 = 2 x 4) takes the same steps as one
    process: the classifier's body blocks and the encoder-decoder's encoder and decoder blocks
    are each a unit (not the root alone); padded pairs count every target once."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    here = str(Path(__file__).parent)
    (tmp_path / "data").mkdir()
    _data(tmp_path / "data")
    data = str(tmp_path / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "one.err", "w") as err:  # the two runs are independent: at once
        one = subprocess.Popen(
            [sys.executable, str(script), task, str(tmp_path / "one"), "ddp", here, data],
            stdout=subprocess.DEVNULL, stderr=err, env=env,
        )  # fmt: skip
        try:
            two = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", str(script), task, str(tmp_path / "two"), "fsdp", here,
                 data],
                capture_output=True, text=True, env=env, timeout=300,
            )  # fmt: skip
            assert one.wait(timeout=300) == 0, (tmp_path / "one.err").read_text()[-3000:]
        finally:
            one.kill()
            one.wait()
    assert two.returncode == 0, two.stderr[-3000:]
    losses = [
        [json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").open()]
        for run in ("one", "two")
    ]
    assert len(losses[0]) == 4 and losses[0] == pytest.approx(losses[1], abs=1e-5)
    a, b = zoo.load(tmp_path / "one" / "model"), zoo.load(tmp_path / "two" / "model")
    for key, value in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[key], value, atol=1e-5, rtol=0)
    sharded = json.loads((tmp_path / "two" / "sharded.json").read_text())
    blocks = (
        ["body.blocks.0", "body.blocks.1"]
        if task == "classify"
        else ["encoder.0", "encoder.1", "decoder.0", "decoder.1"]
    )
    assert sorted(sharded) == sorted(["", *blocks])  # the root and each block
    assert json.loads((tmp_path / "one" / "sharded.json").read_text()) == []
