"""Every count a user types is bounded by what it controls (``zoo train
--eval-batches 4611686018427387904`` was once taken, and the run never ended, deaf to SIGTERM):
each flag at 2**62 is refused in one line, exit 2, before torch is imported, naming the flag
and its bound; each bound itself is taken."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_probe import refused_before_torch

from zoo.cli.bounds import MAX_LORA_RANK, MAX_QUEUE, MAX_SLOTS
from zoo.config import MAX_TOKENS
from zoo.errors import ConfigError
from zoo.train.config import MAX_BATCH, MAX_EVAL_BATCHES, MAX_STEPS, TrainConfig

BIG = str(2**62)
NEW = ["train", "gpt2-124m", "--data", "DATA", "--out", "o"]
TRAIN = ["train", "shakespeare-byte", "--data", "DATA", "--out", "o"]
SERVE = ["serve", "shakespeare-byte"]
#: (argv, what the error says).
CASES = [
    ([*TRAIN, "--eval-batches", BIG], "--eval-batches) must be at most 10,000"),
    ([*TRAIN, "--steps", BIG], "--steps) must be at most 1,000,000,000"),
    ([*TRAIN, "--batch-size", BIG], "--batch-size) must be at most 1,048,576"),
    ([*TRAIN, "--batch-size", "8", "--grad-accum", "16"], "--grad-accum) must be at most 8"),
    ([*TRAIN, "--warmup", BIG], "--warmup) must be at most 1,000,000,000"),
    ([*TRAIN, "--eval-every", BIG], "--eval-every) must be at most"),
    ([*TRAIN, "--checkpoint-every", BIG], "--checkpoint-every) must be at most"),
    ([*TRAIN, "--lora", BIG], "--lora must be at most 65,536"),
    ([*NEW, "--train-tokenizer", BIG], "--train-tokenizer must be at most 16,777,216"),
    (
        [*NEW, "--train-tokenizer", "300", "--tokenizer-max-distinct", BIG],
        "--tokenizer-max-distinct must be at most",
    ),
    (["generate", "shakespeare-byte", "hi", "--max-new-tokens", BIG], "--max-new-tokens must"),
    (["generate", "shakespeare-byte", "hi", "--top-k", BIG], "--top-k must be at most"),
    (["chat", "shakespeare-byte", "--max-new-tokens", BIG], "--max-new-tokens must be at most"),
    ([*SERVE, "--max-batch", BIG], "--max-batch must be at most 65,536"),
    ([*SERVE, "--max-queue", BIG], "--max-queue must be at most 1,048,576"),
    ([*SERVE, "--max-model-len", BIG], "--max-model-len must be at most 16,777,216"),
    ([*SERVE, "--prefill-chunk", BIG], "--prefill-chunk must be at most 16,777,216"),
    ([*SERVE, "--prefix-cache-mb", BIG], "--prefix-cache-mb must be at most"),
    ([*SERVE, "--max-body-bytes", BIG], "--max-body-bytes must be at most 1,073,741,824"),
    ([*SERVE, "--random", "--seed", str(2**70)], "--seed: seed must be an integer from 0"),
    (["tour", "--max-mib", "nan"], "--max-mib must be a finite number, 0 or more, got nan"),
    (["tour", "--max-mib", "inf"], "--max-mib must be a finite number"),
]


def test_every_count_is_bounded_before_torch_is_imported(tmp_path: Path) -> None:
    # each command's run stubbed out: a count that is not refused is reported, not run
    refused_before_torch(tmp_path, CASES, stub=True)
    assert not (tmp_path / "o").exists()


def test_each_bound_itself_is_taken() -> None:
    TrainConfig(
        steps=MAX_STEPS, warmup=MAX_STEPS, eval_every=MAX_STEPS, checkpoint_every=MAX_STEPS,
        batch_size=MAX_BATCH, grad_accum=MAX_BATCH, eval_batches=MAX_EVAL_BATCHES,
    )  # fmt: skip
    for name, high in (("eval_batches", MAX_EVAL_BATCHES), ("batch_size", MAX_BATCH)):
        with pytest.raises(ConfigError, match="must be at most"):
            TrainConfig(**{name: high + 1})
    import argparse

    from zoo.cli.bounds import check_counts, generation_bounds, serve_bounds, train_bounds

    at_bounds = argparse.Namespace(
        max_new_tokens=MAX_TOKENS, top_k=MAX_TOKENS, lora=MAX_LORA_RANK, max_batch=MAX_SLOTS,
        max_queue=MAX_QUEUE, max_model_len=MAX_TOKENS, prefill_chunk=MAX_TOKENS,
        train_tokenizer=MAX_TOKENS, tokenizer_max_distinct=1, prefix_cache_mb=1,
        max_body_bytes=2**30,
    )  # fmt: skip
    check_counts(at_bounds, [*generation_bounds(), *train_bounds(), *serve_bounds()])


def test_a_second_stop_signal_stops_a_run_at_once() -> None:
    """The first SIGTERM asks for a checkpoint at the end of the step; a long step or
    evaluation heard nothing more, and only SIGKILL ended it: a second signal now does."""
    import signal

    from zoo.train.loop import _stop_requests

    with _stop_requests() as asked:
        os.kill(os.getpid(), signal.SIGTERM)
        assert asked() == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt, match="again"):
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))  # (the handler runs between bytecodes)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_slots_that_cannot_fit_are_refused_before_they_are_allocated(monkeypatch) -> None:
    """zoo serve --max-batch 65536 on shakespeare-byte (77 GB of keys and values) was a
    RuntimeError traceback from the allocator; the slot batch now says what fits."""
    import zoo
    import zoo.runtime.slots as slots
    from zoo.errors import InsufficientMemoryError

    model = zoo.build("shakespeare-byte", n_layers=1, d_model=32, n_heads=2, d_ff=64)
    monkeypatch.setattr(slots, "available_memory", lambda device: 10**6)
    refused = r"65536 slots of 128 positions need 2.1 GB .* --max-batch 27 fits"
    with pytest.raises(InsufficientMemoryError, match=refused):  # 32 kB a slot, 0.9 MB free
        slots.SlotBatch(model, 65536)
    assert len(slots.SlotBatch(model, 27)._k) == 1


@pytest.mark.parametrize("text", [str(2**62), "100000", "257"])
def test_zoo_decode_threads_is_bounded(text) -> None:
    """ZOO_DECODE_THREADS=2**62 was 'Overflow when unpacking long'; 100000 a traceback (can't
    start new thread). At most 256, or the cores where there are more."""
    from zoo.settings import Settings

    if (os.cpu_count() or 1) >= int(text):
        pytest.skip("a machine with that many cores")
    with pytest.raises(ConfigError, match=r"thread count from 1 to \d+ \(this machine has"):
        Settings.from_env({"ZOO_DECODE_THREADS": text})
    assert Settings.from_env({"ZOO_DECODE_THREADS": "256"}).decode_threads == 256
