"""A save is all-or-nothing at every instant: under a real ``kill -9`` at random points, a
``KeyboardInterrupt`` at each step of the switch, and two processes saving to one folder at
once, the folder always loads, and holds entirely the old or entirely the new checkpoint."""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from forkserver import Forked, ForkServer

import zoo
import zoo.checkpoint.commit as commit
from zoo.testing import small_overrides

#: What each writer process starts from: zoo imported and the two candidate models built, once
#: for the module (a fork server forks the writers from there: real processes, which a test
#: kills with SIGKILL mid-save, without paying Python's and torch's start-up each time).
SETUP = """
import torch, zoo
from zoo.testing import small_overrides

def build(seed):
    torch.manual_seed(seed)
    return zoo.build("gpt2-124m", **small_overrides("gpt2-124m"))

models = {seed: build(seed) for seed in (1, 2)}
"""


@pytest.fixture(scope="module")
def writers() -> Iterator[ForkServer]:
    server = ForkServer(SETUP)
    yield server
    server.close()


def build(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return zoo.build("gpt2-124m", **small_overrides("gpt2-124m"))


def which(directory: Path, candidates: dict[int, torch.nn.Module], verify: bool = True) -> int:
    """The seed of the one candidate the checkpoint equals entirely (fails on a mix)."""
    loaded = zoo.load(directory, verify=verify, tokenizer=False).state_dict()
    matches = [
        seed
        for seed, model in candidates.items()
        if all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    ]
    assert len(matches) == 1, f"the checkpoint is a mix of versions (matches {matches})"
    return matches[0]


def hidden(directory: Path) -> list[str]:
    """zoo's hidden entries besides the current-version link and the lock: after a clean
    save or load, exactly the current version folder (no staging folders left behind)."""
    ours = (p.name for p in directory.iterdir() if p.name.startswith(".zoo-"))
    return sorted(n for n in ours if n not in (".zoo-current", ".zoo-lock"))


def child(writers: ForkServer, directory: Path, seeds: str, rounds: int) -> Forked:
    """A process saving the models of ``seeds`` ("2,1": seed 2, then 1, in turn) to
    ``directory`` ``rounds`` times."""
    order = [int(s) for s in seeds.split(",")]
    return writers.start(
        f"order = [models[s] for s in {order!r}]\n"
        f"for i in range({rounds}):\n"
        f"    zoo.save(order[i % len(order)], {str(directory)!r})\n"
    )


def test_kill_9_at_random_points_never_loses_the_checkpoint(
    tmp_path: Path, writers: ForkServer
) -> None:
    models = {1: build(1), 2: build(2)}
    target = tmp_path / "ckpt"
    zoo.save(models[1], target)
    rng = random.Random(0)
    seen = set()
    for _ in range(6):
        process = child(writers, target, "2,1", 10_000)
        try:
            process.wait(timeout=rng.uniform(0.05, 0.8))
        except subprocess.TimeoutExpired:
            process.kill()  # SIGKILL, mid-save
            process.wait()
        seen.add(which(target, models))  # loads, and is one version entirely
        assert len(hidden(target)) == 1, "the load did not clean what the killed save left"
    assert seen  # (which versions survived depends on where the kills landed)


@pytest.mark.parametrize("fail_at", range(1, 5))
def test_ctrl_c_at_each_step_of_the_switch_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    """A KeyboardInterrupt just before the config rename used to leave new weights with the
    old config.json (and verify=False loaded the mix silently)."""
    old, new = build(1), build(2)
    zoo.save(old, tmp_path)
    calls = 0
    real_link = commit._link

    def interrupted(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == fail_at:
            raise KeyboardInterrupt
        return real_link(*args, **kwargs)

    monkeypatch.setattr(commit, "_link", interrupted)
    try:
        zoo.save(new, tmp_path)
    except KeyboardInterrupt:
        expected = 1
    else:
        expected = 2  # fewer link steps than fail_at: the save completed
    monkeypatch.setattr(commit, "_link", real_link)
    assert which(tmp_path, {1: old, 2: new}, verify=False) == expected
    zoo.save(new, tmp_path)  # and the folder is still usable
    assert which(tmp_path, {1: old, 2: new}) == 2 and len(hidden(tmp_path)) == 1


def test_an_older_plain_checkpoint_is_adopted_without_a_mix(tmp_path: Path) -> None:
    """A folder of plain files (written before versioned saves) is switched over safely, and
    other files in the folder are left alone."""
    old, new = build(1), build(2)
    zoo.save(old, tmp_path)
    for name in ("config.json", "model.safetensors"):  # make it look like an old-style save
        data = (tmp_path / name).read_bytes()
        (tmp_path / name).unlink()
        (tmp_path / name).write_bytes(data)
    for entry in tmp_path.glob(".zoo-*"):
        if entry.is_dir() and not entry.is_symlink():
            import shutil

            shutil.rmtree(entry)
        else:
            entry.unlink()
    (tmp_path / "notes.txt").write_text("mine")
    assert which(tmp_path, {1: old, 2: new}) == 1
    zoo.save(new, tmp_path)
    assert which(tmp_path, {1: old, 2: new}) == 2
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_two_concurrent_writers_take_turns(tmp_path: Path, writers: ForkServer) -> None:
    models = {1: build(1), 2: build(2)}
    target = tmp_path / "ckpt"
    for _ in range(2):
        both = [child(writers, target, "1", 4), child(writers, target, "2", 4)]
        for process in both:
            assert process.wait(timeout=120) == 0
        which(target, models)
        assert len(hidden(target)) == 1


def test_a_link_left_by_a_killed_switch_is_cleaned(tmp_path: Path) -> None:
    """kill -9 between making a link and renaming it into place leaves a `.zoo-link-*`; the
    next load removes it (found by the random kill test above)."""
    zoo.save(build(1), tmp_path)
    (tmp_path / ".zoo-link-0123").symlink_to(".zoo-current/config.json")
    which(tmp_path, {1: build(1)})
    assert hidden(tmp_path) == [p.name for p in tmp_path.glob(".zoo-v*")]


def versions(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob(".zoo-v*"))


def test_kill_9_during_repeated_saves_keeps_at_most_two_versions(
    tmp_path: Path, writers: ForkServer
) -> None:
    """Saves clean what a killed save left (they used to try a lock the saving process
    already held, so nothing was ever removed: 23 full copies after 30 kills). With no load
    in between, a folder holds at most its current version and the one a killed save was
    writing; one clean save later, exactly one."""
    target = tmp_path / "ckpt"
    zoo.save(build(1), target)
    rng = random.Random(1)
    for _ in range(8):
        process = child(writers, target, "2,1", 10_000)
        time.sleep(rng.uniform(0.05, 0.6))
        process.kill()  # SIGKILL, usually mid-save
        process.wait()
        assert len(versions(target)) <= 2, versions(target)
    zoo.save(build(1), target)
    assert len(versions(target)) == 1 and len(hidden(target)) == 1


def test_a_load_racing_a_save_loop_never_mixes_versions(
    tmp_path: Path, writers: ForkServer
) -> None:
    """One process saving two models in turn as fast as it can, this one loading with
    verify=True for a few seconds: every load is entirely one of the two, and none raises
    (before, ~1 load in 20 paired one save's config.json with another's weights and ~1 in 6
    was a false ChecksumMismatchError)."""
    models = {1: build(1), 2: build(2)}
    target = tmp_path / "ckpt"
    zoo.save(models[1], target)
    writer = child(writers, target, "2,1", 1_000_000)
    seen, loads = set(), 0
    try:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            seen.add(which(target, models, verify=True))
            loads += 1
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -9, "the writer stopped by itself: it did not save throughout"
    assert loads >= 10 and seen == {1, 2}, (loads, seen)


def test_a_file_replaced_by_hand_is_read_as_it_stands(tmp_path: Path) -> None:
    """A load reads one pinned version, except where a user replaced a name by a plain file
    (an edited config.json): then the folder is read as the names say, edit included."""
    zoo.save(build(1), tmp_path)
    config = tmp_path / "config.json"
    text = config.read_text().replace('"model_name": "gpt2-124m"', '"model_name": null')
    assert text != config.read_text()
    config.unlink()
    config.write_text(text)
    assert zoo.load(tmp_path, tokenizer=False).name is None
