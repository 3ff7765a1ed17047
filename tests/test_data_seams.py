"""Seams of training data: the token cache is keyed by what decides its ids and
checked before use, tokenizing streams ids to disk with bounded memory and leaves no
temporary behind when killed, and a vocabulary too large to train is refused cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import zoo
from zoo.train.data import TokenData

ROOT = Path(__file__).resolve().parent.parent


def _word_level(vocab: dict[str, int]):
    """A one-token-per-word tokenizer of the ``tokenizers`` library with ``vocab``."""
    import tokenizers
    from tokenizers import models, pre_tokenizers

    from zoo.tokenizers import HFTokenizer

    library = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    library.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return HFTokenizer(library, name="words", roles={"unk": "[UNK]"})


def _expected(sources: list[Path], tok) -> list[int]:
    return [i for source in sources for i in tok.encode(source.read_text())]


# -- the cache key and its checks ----------------------------------------------------------------
def test_two_tokenizers_of_one_name_and_size_get_different_caches(tmp_path):
    """Same name, same vocabulary size, different ids: the second run must not train on the
    first one's tokens (the key was name + size + text)."""
    data = tmp_path / "a.txt"
    data.write_text("a b b a b")
    first = _word_level({"[UNK]": 0, "a": 1, "b": 2})
    second = _word_level({"[UNK]": 0, "a": 2, "b": 1})
    assert (first.name, first.vocab_size) == (second.name, second.vocab_size)
    one = TokenData.build([data], first, tmp_path / "cache", 0.1)
    two = TokenData.build([data], second, tmp_path / "cache", 0.1)
    assert one.path != two.path
    assert one.tokens.tolist() == [1, 2, 2, 1, 2]
    assert two.tokens.tolist() == [2, 1, 1, 2, 1]
    assert first.fingerprint() != second.fingerprint()


def test_moving_text_across_a_file_boundary_changes_the_key(tmp_path):
    """Files are encoded one by one, so 'ab c|d' and 'ab|c d' give different ids even though
    their bytes run together are the same."""
    tok = zoo.tokenizer("gpt2-124m")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (one / "1.txt").write_text("hello wor")
    (one / "2.txt").write_text("ld again")
    (two / "1.txt").write_text("hello")
    (two / "2.txt").write_text(" world again")
    first_sources = sorted(one.glob("*.txt"))
    second_sources = sorted(two.glob("*.txt"))
    first = TokenData.build(first_sources, tok, tmp_path / "cache", 0.1)
    second = TokenData.build(second_sources, tok, tmp_path / "cache", 0.1)
    assert first.path != second.path
    assert first.tokens.tolist() == _expected(first_sources, tok)
    assert second.tokens.tolist() == _expected(second_sources, tok)
    assert first.tokens.tolist() != second.tokens.tolist()


def _corrupt_out_of_range(path: Path) -> None:
    ids = np.fromfile(path, dtype=np.uint16)
    ids[3] = 60000  # beyond the byte tokenizer's 257 ids
    ids.tofile(path)


def _corrupt_in_range(path: Path) -> None:
    ids = np.fromfile(path, dtype=np.uint16)
    ids[3] = (int(ids[3]) + 1) % 256  # still a valid id: only the recorded sha256 tells
    ids.tofile(path)


def _truncate(path: Path) -> None:
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size - 6)


def _lose_the_record(path: Path) -> None:
    path.with_suffix(".json").unlink()


@pytest.mark.parametrize(
    "damage", [_corrupt_out_of_range, _corrupt_in_range, _truncate, _lose_the_record]
)
def test_a_damaged_token_cache_is_rebuilt_not_trained_on(tmp_path, damage):
    data = tmp_path / "a.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 50)
    tok = zoo.tokenizer("byte")
    built = TokenData.build([data], tok, tmp_path / "cache", 0.1)
    expected = _expected([data], tok)
    assert built.tokens.tolist() == expected
    path = built.path
    del built
    damage(path)
    again = TokenData.build([data], tok, tmp_path / "cache", 0.1)
    assert again.path == path
    assert again.tokens.tolist() == expected


def test_an_unchanged_cache_is_reused(tmp_path, monkeypatch):
    import zoo.train.data as data_module

    data = tmp_path / "a.txt"
    data.write_text("some text to tokenize " * 20)
    tok = zoo.tokenizer("byte")
    TokenData.build([data], tok, tmp_path / "cache", 0.1)

    def fail(*args, **kwargs):
        raise AssertionError("a valid cache was tokenized again")

    monkeypatch.setattr(data_module, "_tokenize", fail)
    assert TokenData.build([data], tok, tmp_path / "cache", 0.1).tokens.tolist() == (
        _expected([data], tok)
    )


# -- streaming ids to disk; no temporary left by a killed run ------------------------------------
PEAK_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    import zoo
    from zoo.train.data import TokenData
    tok = zoo.tokenizer(sys.argv[3])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = TokenData.build([Path(sys.argv[1])], tok, Path(sys.argv[2]), 0.1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"grew_mb": (peak - base) / 1024, "tokens": len(data.tokens)}))
    """
)


@pytest.mark.parametrize("name", ["byte", "gpt2-124m"])
def test_tokenizing_one_long_line_streams_ids_to_disk(tmp_path, name):
    """20 MB on one line: the ids are written as they come, so the process grows by less than
    3x the text (it grew by 10x: every id in a Python list first, then an array of them)."""
    data = tmp_path / "line.txt"
    unit = "The quick brown fox, 42 times, jumps over the lazy dog; Zoe's cafe! "
    data.write_text(unit * (20_000_000 // len(unit)))
    size_mb = data.stat().st_size / 2**20
    out = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, str(data), str(tmp_path / "cache"), name],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["tokens"] > 1_000_000
    assert result["grew_mb"] <= 3 * size_mb, (result, size_mb)


KILL_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from zoo.tokenizers.byte import ByteTokenizer
    from zoo.train.data import TokenData

    class Slow(ByteTokenizer):
        def _encode_iter(self, text, allowed):
            for ids in super()._encode_iter(text, allowed):
                yield ids
                time.sleep(0.05)

    TokenData.build([Path(sys.argv[1])], Slow(), Path(sys.argv[2]), 0.1)
    """
)


def test_a_run_killed_while_tokenizing_leaves_no_temporary_for_ever(tmp_path):
    data = tmp_path / "a.txt"
    data.write_text("x" * 3_000_000)  # ~46 pieces, 50 ms each
    cache = tmp_path / "cache"
    child = subprocess.Popen(
        [sys.executable, "-c", KILL_CHILD, str(data), str(cache)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            temporaries = [p for p in cache.glob("*.tmp") if p.stat().st_size > 0]
            if temporaries or child.poll() is not None:
                break
            time.sleep(0.02)
        assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    left = list(cache.glob("*.tmp"))
    assert left and not list(cache.glob("*.bin"))  # the killed run left its half-file
    tok = zoo.tokenizer("byte")
    again = TokenData.build([data], tok, cache, 0.1)
    assert not list(cache.glob("*.tmp")), list(cache.iterdir())
    assert again.tokens.tolist() == _expected([data], tok)


def test_a_live_writers_temporary_is_kept(tmp_path):
    """Another run tokenizing into the same folder right now keeps its file."""
    from zoo.train.data import _host, _remove_stale_temporaries

    cache = tmp_path / "cache"
    cache.mkdir()
    mine = cache / f"tokens-abc123.{_host()}.{os.getpid()}.tmp"
    mine.write_bytes(b"12")
    _remove_stale_temporaries(cache)
    assert mine.exists()


# -- a vocabulary too large to train ---------------------------------------------------------------
TRAIN_CHILD = textwrap.dedent(
    """
    import sys
    from zoo.tokenizers import TokenizerError
    from zoo.tokenizers.subword import SubwordBPE
    try:
        SubwordBPE.train(["hello world"] * 10, int(sys.argv[1]))
    except TokenizerError as exc:
        print("refused:", exc)
    else:
        print("trained")
    """
)


@pytest.mark.parametrize("size", [2**32, 10**12, 2**24 + 1])
def test_a_huge_vocab_size_is_refused_not_an_abort(size):
    out = subprocess.run(
        [sys.executable, "-c", TRAIN_CHILD, str(size)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])  # not SIGABRT (-6)
    assert out.stdout.startswith("refused:"), out.stdout
    assert "at most 16,777,216" in out.stdout and "2**24" in out.stdout


def test_the_largest_vocab_size_allowed_trains():
    from zoo.tokenizers.subword import MAX_VOCAB, SubwordBPE

    assert SubwordBPE.train(["hello world"] * 10, MAX_VOCAB).vocab_size < 300


def test_train_tokenizer_with_a_huge_size_is_a_clean_command_line_error(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("a b\tb a\nc d\td c\n" * 20)
    script = "import sys; from zoo.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [
        "train", "transformer-encdec-tiny", "--train-tokenizer", "1000000000000",
        "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "1",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode > 0, (out.returncode, out.stderr[-2000:])  # an error, not a signal
    assert "at most 16,777,216" in out.stderr, out.stderr[-2000:]
