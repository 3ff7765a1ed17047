"""Issue 28 on `zoo train`: clear errors for the meta device and for numbers out of range, a
time budget that trains the steps that fit, the loss plot and the warm-up said at the start,
and `zoo info` of a run's folder."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_train_seams import BYTE, CONFIG, ENV, WORDS, run, zoo_train

import zoo
from zoo.cli import main
from zoo.errors import ConfigError
from zoo.train import TrainConfig, train

SEED_RANGE_WORDS = "seed must be an integer from 0 to 2**64 - 1 (18446744073709551615)"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text((WORDS + ".\n") * 100)
    return path


def config(**changes: Any) -> TrainConfig:
    return TrainConfig(**{**CONFIG.__dict__, **changes})


# -- 10. the meta device ---------------------------------------------------------------------
def test_zoo_train_on_the_meta_device_is_a_clear_error(corpus, tmp_path, capsys):
    assert main(zoo_train(corpus, tmp_path / "run", "--device", "meta")) == 2
    err = capsys.readouterr().err
    assert "meta device" in err and "zoo train --device cpu" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before anything was made


def test_train_refuses_the_meta_device_and_a_model_on_it_in_python(corpus, tmp_path):
    with pytest.raises(ConfigError, match=r"meta device .* cannot train"):
        run(corpus, tmp_path / "a", device="meta")
    on_meta = zoo.build("gpt2-124m", n_layers=1, d_model=32, n_heads=2, d_ff=64, device="meta")
    with pytest.raises(ConfigError, match=r"meta device .* cannot train"):
        train(on_meta, corpus, tmp_path / "b", config=CONFIG, tokenizer=BYTE, log=None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- 11. numbers out of range --------------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**70, 2**64, -(2**63) - 1])
def test_a_seed_out_of_range_names_the_range_zoo_generate_names(corpus, tmp_path, capsys, seed):
    assert main(zoo_train(corpus, tmp_path / "run", "--seed", str(seed))) == 2
    err = capsys.readouterr().err
    assert SEED_RANGE_WORDS in err and str(seed) in err and "Overflow" not in err
    with pytest.raises(ConfigError, match=r"seed must be an integer from 0 to 2\*\*64 - 1"):
        TrainConfig(seed=seed)


@pytest.mark.parametrize(
    "name", ["steps", "batch_size", "grad_accum", "warmup", "eval_every", "eval_batches"]
)
def test_every_count_beyond_int64_is_refused_by_name(corpus, tmp_path, capsys, name):
    flag = "--" + name.replace("_", "-")
    assert main(zoo_train(corpus, tmp_path / "run", flag, str(2**70))) == 2
    assert f"TrainConfig.{name} must be at most 2**63 - 1" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=f"TrainConfig.{name} must be at most"):
        TrainConfig(**{name: 2**63})
    TrainConfig(checkpoint_every=2**63 - 1)  # the largest is taken


def test_the_top_of_the_seed_range_trains(corpus, tmp_path):
    """The loop seeds the evaluation with seed + 1: 2**64 overflowed a torch.Generator."""
    result = run(corpus, tmp_path / "run", config=config(steps=1, eval_batches=1, seed=2**64 - 1))
    assert result.steps == 1 and result.val_loss is not None


def test_the_memory_advice_for_a_huge_batch_is_immediate():
    """The advice looked for a smaller batch one size at a time, from the one given down: a
    batch of 2**62 never finished. Run in a child process with a timeout."""
    code = textwrap.dedent(
        """
        import torch, zoo
        from zoo.errors import InsufficientMemoryError
        from zoo.train import TrainConfig
        from zoo.train.memory import check_training_memory
        model = zoo.build("gpt2-124m", device="meta", n_layers=1, d_model=32, n_heads=2,
                          d_ff=64, context_length=16, vocab_size=257)
        try:
            check_training_memory(model, TrainConfig(batch_size=2**62), torch.device("cpu"),
                                  available=2**30)
        except InsufficientMemoryError as exc:
            print(str(exc).split("Settings that fit: ")[1])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("--batch-size "), done.stdout
    assert 1 <= int(done.stdout.split()[1].rstrip(".;")) < 2**62
