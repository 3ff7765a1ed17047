"""Training: losses fall, a resumed run equals an uninterrupted one bit for bit, two gloo
processes under torchrun (DDP) equal one process, and bad data is a clear error."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import zoo
from zoo.tokenizers import SubwordBPE
from zoo.train import DataError, TrainConfig, train

WORDS = "the quick brown fox jumps over a lazy dog and then runs far into the green wood"
TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "context_length": 32}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS.split()) for _ in range(10)) + "." for _ in range(400)]
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return SubwordBPE.train([corpus.read_text()], 300)


def tiny(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return zoo.build("gpt2-124m", **{**TINY, "vocab_size": 300, "dropout": 0.0, **overrides})


CONFIG = TrainConfig(steps=20, batch_size=8, lr=3e-3, min_lr=3e-4, warmup=2, eval_every=10)


def test_losses_fall_and_the_result_is_a_normal_checkpoint(corpus, tokenizer, tmp_path):
    result = train(tiny(), corpus, tmp_path / "run", config=CONFIG, tokenizer=tokenizer, log=None)
    assert result.steps == 20 and len(result.losses) == 20
    assert result.losses[-1] < result.losses[0] - 1.0
    loaded = zoo.load(result.checkpoint)
    assert loaded.tokenizer is not None and loaded.tokenizer.vocab_size == 300
    for key, value in result.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key].cpu(), value.cpu()), key
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [m["step"] for m in metrics] == list(range(1, 21)) and "val_loss" in metrics[-1]
    png = (tmp_path / "run" / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000  # the loss curve
    assert zoo.generate(loaded, "the quick", max_new_tokens=5, temperature=0)


def test_a_resumed_run_equals_an_uninterrupted_one(corpus, tokenizer, tmp_path):
    config = TrainConfig(**{**CONFIG.__dict__, "checkpoint_every": 0})
    whole = train(
        tiny(dropout=0.1), corpus, tmp_path / "a", config=config, tokenizer=tokenizer, log=None
    )

    def interrupt_at_10(line: str) -> None:  # SIGINT arrives at step 10's evaluation
        if line.startswith("step 10:"):
            os.kill(os.getpid(), signal.SIGINT)

    first = train(
        tiny(dropout=0.1),
        corpus,
        tmp_path / "b",
        config=config,
        tokenizer=tokenizer,
        log=interrupt_at_10,
    )
    assert first.steps == 11  # finished the step under way, evaluated, wrote a checkpoint
    assert first.val_loss is not None
    rest = train(
        tiny(seed=99, dropout=0.1),
        corpus,
        tmp_path / "b",
        config=config,
        tokenizer=tokenizer,
        log=None,
    )
    assert rest.steps == 20 and len(rest.losses) == 9
    assert first.losses + rest.losses == whole.losses  # bit for bit
    for key, value in whole.model.state_dict().items():
        assert torch.equal(rest.model.state_dict()[key], value), key


def gloo_args(corpus: Path) -> list[str]:
    """The run the distributed ones must equal: global batch 8, 6 steps, no dropout."""
    settings = [f"--set={k}={v}" for k, v in {**TINY, "dropout": 0}.items()]
    return [
        *("train", "gpt2-124m", "--data", str(corpus), "--steps", "6", "--batch-size", "8"),
        *("--warmup", "1", "--eval-every", "0", "--lr", "3e-3", *settings),
    ]


class OneProcessRun:
    """The single-process run both distributed strategies are compared with: started once,
    in the background (it runs while the first distributed run does), waited for on use."""

    def __init__(self, corpus: Path, out: Path) -> None:
        self.out = out
        with open(out.parent / "one.err", "w") as err:  # the child writes to its own copy
            self._process = subprocess.Popen(
                [sys.executable, "-m", "zoo.cli", *gloo_args(corpus), "--out", str(out)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )

    def wait(self) -> Path:
        """The run's folder, once it has ended well."""
        code = self._process.wait(timeout=300)
        assert code == 0, (self.out.parent / "one.err").read_text()[-2000:]
        return self.out

    def kill(self) -> None:
        self._process.kill()
        self._process.wait()


@pytest.fixture(scope="module")
def one_process_run(corpus, tmp_path_factory) -> Iterator[OneProcessRun]:
    run = OneProcessRun(corpus, tmp_path_factory.mktemp("gloo") / "one")
    yield run
    run.kill()


@pytest.mark.slow  # three processes start torch and train under torchrun
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_processes_equal_one(corpus, tmp_path, strategy, one_process_run):
    """DDP, and FSDP2, with global batch B (2 processes x 4) take the same steps as one
    process with B; the distributed run's checkpoint loads in one process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "zoo.cli",
            *gloo_args(corpus),
            "--out",
            str(tmp_path / "two"),
            "--strategy",
            strategy,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    one = one_process_run.wait()
    assert two.returncode == 0, two.stderr[-3000:]
    losses = [
        [json.loads(line)["loss"] for line in (run / "metrics.jsonl").open()]
        for run in (one, tmp_path / "two")
    ]
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    a, b = zoo.load(one / "model"), zoo.load(tmp_path / "two" / "model")
    for key, value in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[key], value, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"good text\nmore\n\xff\xfe bad bytes\n", "line 3: not UTF-8"),
        (b"too short", "fewer than one window"),
    ],
)
def test_bad_data_is_a_clear_error(tokenizer, tmp_path, content, message):
    path = tmp_path / "data.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        train(tiny(), path, tmp_path / "run", config=CONFIG, tokenizer=tokenizer, log=None)


def test_missing_data_is_a_clear_error(tokenizer, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        train(tiny(), tmp_path / "nope.txt", tmp_path / "run", config=CONFIG, tokenizer=tokenizer)


def test_a_tokenizer_larger_than_the_model_is_refused_before_training(corpus, tmp_path):
    with pytest.raises(ValueError, match="tokenizer 'gpt2-bpe' has 50257 ids"):
        train(tiny(), corpus, tmp_path / "run", config=CONFIG, tokenizer=zoo.tokenizer("gpt2-124m"))


def test_the_progress_bar_shows_loss_rate_and_speed(corpus, tokenizer, tmp_path, capsys):
    train(tiny(), corpus, tmp_path / "run", config=CONFIG, tokenizer=tokenizer, log=print)
    err = capsys.readouterr().err
    assert "20/20" in err and "loss=" in err and "lr=" in err and "tok_s=" in err


def _worker_pid(out: Path, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` training into ``out``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmdline and f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


@pytest.mark.slow  # torchrun, then waits for the survivor's collective to time out
def test_a_rank_that_dies_ends_the_run_with_an_error_not_a_hang(corpus, tmp_path):
    import time

    out = tmp_path / "run"
    args = [
        "train", "gpt2-124m", "--data", str(corpus), "--out", str(out), "--steps", "100000",
        "--batch-size", "4", "--eval-every", "0",
        *[f"--set={k}={v}" for k, v in {**TINY, "dropout": 0}.items()],
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ZOO_DIST_TIMEOUT": "20"}
    run = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "zoo.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list((out / "data").glob("tokens-*.bin")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # both ranks are in the loop
        pid = _worker_pid(out, 1)
        assert pid is not None, "rank 1 was not found"
        os.kill(pid, signal.SIGKILL)
        _, err = run.communicate(timeout=90)  # ends, rather than hanging
    finally:
        run.kill()
    assert run.returncode != 0
    assert "exitcode" in err and "-9" in err  # torchrun names the rank that died


# -- encoder-decoders: parallel TSV, teacher forcing ------------------------------------------
@pytest.mark.slow  # 600 training steps
def test_an_encoder_decoder_learns_to_reverse_from_the_command_line(tmp_path):
    """`zoo train transformer-encdec-tiny --train-tokenizer N`: a byte-level BPE learnt from
    both columns, the model sized to it, teacher forcing; the checkpoint brings its tokenizer."""
    from zoo.cli import main

    rng = random.Random(0)
    letters = "abcdefgh"
    lines = []
    for _ in range(600):
        word = [rng.choice(letters) for _ in range(rng.randint(2, 5))]
        lines.append(" ".join(word) + "\t" + " ".join(reversed(word)))
    data = tmp_path / "reverse.tsv"
    data.write_text("\n".join(lines))
    size = {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_encoder_layers": 2,
            "n_decoder_layers": 2, "context_length": 16, "dropout": 0.0}  # fmt: skip
    argv = [
        "train", "transformer-encdec-tiny", "--train-tokenizer", "270", "--data", str(data),
        "--out", str(tmp_path / "run"), "--steps", "600", "--batch-size", "32", "--lr", "1e-3",
        "--min-lr", "1e-4", "--warmup", "20", "--eval-every", "0",
        *[f"--set={k}={v}" for k, v in size.items()],
    ]  # fmt: skip
    assert main(argv) == 0
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert history[-1]["step"] == 600 and history[-1]["val_loss"] < 0.05, history[-1]
    model = zoo.load(tmp_path / "run" / "model")
    assert model.tokenizer.kind == "subword-bpe"
    assert model.config.vocab_size == model.tokenizer.vocab_size <= 270
    hits = 0
    for line in lines[-20:]:  # held-out pairs
        source, target = line.split("\t")
        out = zoo.generate(model, source, max_new_tokens=12, temperature=0)
        hits += out.split() == target.split()
    assert hits >= 16, hits


def test_the_command_line_names_the_model_once(corpus, tmp_path, capsys):
    from zoo.cli import main

    for argv in (["train"], ["train", "gpt2-124m", "--from", "gpt2-124m"]):
        assert main([*argv, "--data", str(corpus), "--out", str(tmp_path)]) == 2
        assert "name the model once" in capsys.readouterr().err


def test_zoo_train_from_hub_weights_fine_tunes_them(corpus, local_hub, tmp_path):
    """`zoo train --from hf:org/name` starts from the pushed weights and tokenizer: at a
    vanishing learning rate the result is the pushed model."""
    from zoo.cli import main

    pushed = tiny(seed=3, vocab_size=50257)  # with GPT-2's tokenizer, recorded by name
    zoo.push(pushed, "org/tiny")
    argv = [
        "train", "--from", "hf:org/tiny", "--data", str(corpus), "--out", str(tmp_path / "run"),
        "--steps", "2", "--batch-size", "4", "--warmup", "1", "--lr", "1e-12", "--min-lr", "1e-12",
    ]  # fmt: skip
    assert main(argv) == 0
    tuned = zoo.load(tmp_path / "run" / "model")
    assert tuned.name == pushed.name and tuned.tokenizer.name == "gpt2-bpe"
    for key, value in pushed.state_dict().items():
        torch.testing.assert_close(tuned.state_dict()[key], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("content", "message"),
    [("a b\tb a\nno tab here\n", "line 2: no tab"), ("a\tb\n", "too few to hold some out")],
)
def test_bad_pairs_are_clear_errors(tmp_path, content, message):
    data = tmp_path / "pairs.tsv"
    data.write_text(content)
    tok = SubwordBPE.train(["a b c"], 270)
    model = zoo.build("transformer-encdec-tiny", vocab_size=270, d_model=32, n_heads=2, d_ff=64)
    with pytest.raises(DataError, match=message):
        train(model, data, tmp_path / "run", config=CONFIG, tokenizer=tok, log=None)


# -- sequence classification: GPT-1's fine-tuning ------------------------------------------------
def _accuracy(model, tokenizer, rows) -> float:

    hits = 0
    with torch.no_grad():
        for text, label in rows:
            ids = torch.tensor([tokenizer.encode(text)])
            hits += model.config.labels[int(model(ids).argmax())] == label
    return hits / len(rows)


def test_classification_fine_tuning_raises_accuracy(corpus, tokenizer, tmp_path):
    from zoo.train import classifier, labels_in

    rng = random.Random(1)
    rows = []
    for i in range(400):
        label = "pos" if i % 2 else "neg"
        cue = rng.choice(
            ["green wood", "quick fox"] if label == "pos" else ["lazy dog", "runs far"]
        )
        words = [rng.choice(WORDS.split()[:6]) for _ in range(4)]
        words.insert(rng.randint(0, 4), cue)
        rows.append((" ".join(words), label))
    data = tmp_path / "labelled.tsv"
    data.write_text("\n".join(f"{t}\t{y}" for t, y in rows))
    assert labels_in(data) == ["neg", "pos"]
    model = classifier(tiny(), labels_in(data))
    held_out = rows[-40:]
    before = _accuracy(model, tokenizer, held_out)
    config = TrainConfig(steps=120, batch_size=16, lr=3e-3, min_lr=3e-4, warmup=10, eval_every=0)
    result = train(model, data, tmp_path / "run", config=config, tokenizer=tokenizer, log=None)
    after = _accuracy(result.model, tokenizer, held_out)
    assert after >= 0.9 and after > before + 0.2, (before, after)
    loaded = zoo.load(result.checkpoint)  # the head is saved with the checkpoint
    assert type(loaded).__name__ == "SequenceClassifier" and loaded.config.labels == ["neg", "pos"]
    assert _accuracy(loaded, tokenizer, held_out) == after


def test_a_label_outside_the_set_names_the_line(tokenizer, tmp_path):
    from zoo.train import classifier

    data = tmp_path / "labelled.tsv"
    data.write_text("a quick fox\tpos\na lazy dog\tmaybe\n" * 5)
    model = classifier(tiny(), ["neg", "pos"])
    with pytest.raises(DataError, match=r"line 2: label 'maybe' is not one of the model's labels"):
        train(model, data, tmp_path / "run", config=CONFIG, tokenizer=tokenizer, log=None)


def test_zoo_train_classify_from_the_command_line(tmp_path):
    from zoo.cli import main

    data = tmp_path / "labelled.tsv"
    data.write_text("".join(f"a quick fox {i}\tpos\na lazy dog {i}\tneg\n" for i in range(20)))
    argv = [
        "train", "gpt2-124m", "--task", "classify", "--data", str(data),
        "--out", str(tmp_path / "run"), "--steps", "3", "--batch-size", "4", "--warmup", "1",
        *[f"--set={k}={v}" for k, v in TINY.items()],
    ]  # fmt: skip
    assert main(argv) == 0
    model = zoo.load(tmp_path / "run" / "model")
    assert type(model).__name__ == "SequenceClassifier" and model.config.labels == ["neg", "pos"]


def test_bf16_autocast_trains_with_float32_weights(corpus, tokenizer, tmp_path):
    config = TrainConfig(**{**CONFIG.__dict__, "bf16": True})
    result = train(tiny(), corpus, tmp_path / "run", config=config, tokenizer=tokenizer, log=None)
    assert result.losses[-1] < result.losses[0] - 1.0
    assert {p.dtype for p in result.model.parameters()} == {torch.float32}
    plain = train(tiny(), corpus, tmp_path / "fp32", config=CONFIG, tokenizer=tokenizer, log=None)
    assert result.losses != plain.losses  # autocast really ran in bfloat16


def test_a_third_party_model_trains_through_the_same_code(corpus, tmp_path):
    """The README's plugin model (toy-gpt, no decoding code of its own) trains unchanged."""
    torch.manual_seed(0)
    model = zoo.build("toy-gpt-tiny", vocab_size=257, context_length=32)
    result = train(
        model, corpus, tmp_path / "run", config=CONFIG, tokenizer=zoo.tokenizer("byte"), log=None
    )
    assert result.losses[-1] < result.losses[0] - 1.0
    assert type(zoo.load(result.checkpoint)).__name__ == "ToyGPT"
