"""Broken checkpoints: each fault is a clear ``zoo.errors`` error, never a crash or a
silently wrong model, and a failed save loses nothing."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import safetensors.torch
import torch

import zoo
from zoo.checkpoint import convert_pickle_checkpoint
from zoo.errors import (
    CheckpointError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    ZooError,
)

SIZES = {"n_layers": 1, "d_model": 64, "n_heads": 4, "d_ff": 128, "vocab_size": 97}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path_factory.mktemp("zoo-cache")))


@pytest.fixture
def model():
    torch.manual_seed(0)
    return zoo.build("gpt2-124m", **SIZES).eval()


@pytest.fixture
def ckpt(tmp_path: Path, model) -> Path:
    directory = tmp_path / "ckpt"
    zoo.save(model, directory)
    return directory


def edit_manifest(directory: Path, edit) -> None:
    path = directory / "config.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def header_length(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name[0] != "."}


# -- damaged weights files ------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0.5, 0.999, 8, 3])
def test_truncated_file(ckpt: Path, keep: float) -> None:
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: int(keep * len(data)) if keep < 1 else int(keep)])
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        zoo.load(ckpt)
    with pytest.raises(CorruptCheckpointError, match="truncated or damaged"):
        zoo.load(ckpt, verify=False)


def test_flipped_header_bytes(ckpt: Path, model) -> None:
    """Flip bytes all over the header (length prefix and JSON): with the sha256 check the
    error is a mismatch; without it, still a zoo error, never a crash or a loaded model."""
    path = ckpt / "model.safetensors"
    original = path.read_bytes()
    end = header_length(path)
    rng = random.Random(0)
    positions = [0, 1, 7, 8, 9, end - 1, *rng.sample(range(10, end - 1), 40)]
    for pos in positions:
        for mask in (0x01, 0x20):
            damaged = bytearray(original)
            damaged[pos] ^= mask
            path.write_bytes(bytes(damaged))
            with pytest.raises(ChecksumMismatchError):
                zoo.load(ckpt)
            try:
                loaded = zoo.load(ckpt, verify=False)
            except ZooError:
                continue
            # a flip the format cannot see (inside the metadata strings) leaves the weights
            # exactly right
            for key, tensor in model.state_dict().items():
                assert torch.equal(loaded.state_dict()[key], tensor), (pos, key)
    path.write_bytes(original)
    assert zoo.load(ckpt).load_report.ok


def test_flipped_data_byte_is_caught_by_sha256(ckpt: Path) -> None:
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[header_length(path) + 100] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatchError, match=r"config\.json says"):
        zoo.load(ckpt)


def test_wrong_sha256(ckpt: Path) -> None:
    edit_manifest(ckpt, lambda d: d["weights"].update(sha256="ab" * 32))
    with pytest.raises(ChecksumMismatchError, match="abab"):
        zoo.load(ckpt)
    with pytest.raises(ChecksumMismatchError, match="pinned"):
        zoo.checkpoint.load_local(ckpt, sha256="cd" * 32, verify=True)
    edit_manifest(ckpt, lambda d: d["weights"].update(sha256="not-a-hash"))
    with pytest.raises(CheckpointError, match="not a hex sha256"):
        zoo.load(ckpt)
    edit_manifest(ckpt, lambda d: d["weights"].update(sha256=None))
    with pytest.raises(CheckpointError, match="verify=True"):
        zoo.load(ckpt, verify=True)
    assert zoo.load(ckpt).load_report.ok  # nothing recorded, nothing to check


# -- config.json ----------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["architecture", "config", "weights", "format_version"])
def test_missing_manifest_fields(ckpt: Path, field: str) -> None:
    edit_manifest(ckpt, lambda d: d.pop(field))
    with pytest.raises(CheckpointError, match=f"missing required field.*{field}"):
        zoo.load(ckpt)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d["config"].update(d_model="wide"), "config is not valid"),
        (lambda d: d["config"].update(n_embd=64), "has no field 'n_embd'"),
        (lambda d: d.update(format_version=99), "newer than this zoo"),
        (lambda d: d["weights"].update(file="../elsewhere.safetensors"), "plain file name"),
        (lambda d: d["weights"].update(file="other.safetensors"), "no other.safetensors"),
        (lambda d: d.pop("format"), "neither a zoo config"),
        (lambda d: d.update(tokenizer="gpt2-bpe"), "'tokenizer' must be an object"),
    ],
)
def test_invalid_manifest(ckpt: Path, edit, match: str) -> None:
    edit_manifest(ckpt, edit)
    with pytest.raises(CheckpointError, match=match):
        zoo.load(ckpt)


def test_config_json_not_json(ckpt: Path) -> None:
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        zoo.load(ckpt)


def test_unknown_architecture(ckpt: Path) -> None:
    edit_manifest(ckpt, lambda d: d.update(architecture="mamba9", plugin=None))
    with pytest.raises(zoo.UnknownArchitectureError, match=r"'mamba9'.*Install the plugin"):
        zoo.load(ckpt)


# -- keys and shapes ------------------------------------------------------------------------
def test_shape_mismatch(ckpt: Path, caplog: pytest.LogCaptureFixture) -> None:
    edit_manifest(ckpt, lambda d: d["config"].update(d_ff=256))
    with pytest.raises(StateDictMismatchError) as info:
        zoo.load(ckpt)
    message = str(info.value)
    assert "3 shape-mismatched" in message
    assert "blocks.0.ffn.fc.weight: checkpoint (128, 64) float32 vs model (256, 64)" in message
    assert "strict=False" in message
    report = info.value.report
    assert not report.missing and not report.unexpected and len(report.mismatched) == 3
    with caplog.at_level("WARNING", logger="zoo.checkpoint"):
        model = zoo.load(ckpt, strict=False)
    assert "3 shape-mismatched" in caplog.text
    assert model.blocks[0].ffn.fc.weight.shape == (256, 64)
    assert set(model.load_report.initialised) == {
        "blocks.0.ffn.fc.weight",
        "blocks.0.ffn.fc.bias",
        "blocks.0.ffn.proj.weight",
    }
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]))).all()


def test_missing_and_unexpected_keys(ckpt: Path, model) -> None:
    path = ckpt / "model.safetensors"
    state = {k: v.clone() for k, v in safetensors.torch.load_file(str(path)).items()}
    del state["final_norm.weight"], state["blocks.0.attn.qkv.bias"]
    state["blocks.0.attn.gate"] = torch.zeros(2)
    state["blocks.0.attn.qkv.weight"] = state["blocks.0.attn.qkv.weight"].int()
    safetensors.torch.save_file(state, str(path))
    with pytest.raises(StateDictMismatchError) as info:
        zoo.load(ckpt, verify=False)
    message = str(info.value)
    assert "2 missing (blocks.0.attn.qkv.bias; final_norm.weight)" in message
    assert "1 unexpected (blocks.0.attn.gate)" in message
    assert "blocks.0.attn.qkv.weight: checkpoint (192, 64) int32 vs model (192, 64) float32" in (
        message
    )
    loaded = zoo.load(ckpt, verify=False, strict=False)
    assert torch.equal(loaded.final_norm.weight, torch.ones(64))  # LayerNorm's own init
    assert torch.equal(loaded.tok_emb.weight, model.tok_emb.weight)
    assert loaded.head.weight is loaded.tok_emb.weight


def test_many_missing_keys_are_summarised(ckpt: Path) -> None:
    edit_manifest(ckpt, lambda d: d["config"].update(n_layers=3))
    with pytest.raises(StateDictMismatchError, match=r"24 missing \(.*; \.\.\. and 19 more\)"):
        zoo.load(ckpt)


# -- pickles --------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth"])
def test_pickle_files_are_refused(tmp_path: Path, model, suffix: str) -> None:
    path = tmp_path / f"model{suffix}"
    torch.save(model.state_dict(), path)
    with pytest.raises(UnsafeCheckpointError, match="convert_pickle_checkpoint"):
        zoo.load(path)


def test_pickle_disguised_as_safetensors_is_refused(ckpt: Path, model) -> None:
    torch.save(model.state_dict(), ckpt / "model.safetensors")
    with pytest.raises(UnsafeCheckpointError, match="pickle"):
        zoo.load(ckpt, verify=False)


def test_hf_pickle_directory_is_refused_then_converted_on_opt_in(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, n_positions=32, vocab_size=97)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    hf = tmp_path / "hf"
    ref.save_pretrained(hf)
    (hf / "model.safetensors").unlink()
    torch.save(ref.state_dict(), hf / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match=r"pytorch_model\.bin"):
        zoo.load(hf)
    with pytest.raises(UnsafeCheckpointError, match="allow_pickle=True"):
        convert_pickle_checkpoint(hf / "pytorch_model.bin", tmp_path / "safe")
    convert_pickle_checkpoint(hf / "pytorch_model.bin", tmp_path / "safe", allow_pickle=True)
    model = zoo.load(tmp_path / "safe")
    ids = torch.randint(0, 97, (2, 8))
    with torch.no_grad():
        assert (model(ids) - ref(ids).logits).abs().max() <= 1e-5


def test_sharded_hf_checkpoint_is_explained(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(CheckpointError, match="sharded"):
        zoo.load(tmp_path)


# -- interrupted saves ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (OSError(28, "No space left on device"), CheckpointError),  # a clear zoo error
        (safetensors.SafetensorError("I/O error: disk full"), CheckpointError),
        (KeyboardInterrupt(), KeyboardInterrupt),
    ],
)
def test_interrupted_save_keeps_the_previous_checkpoint(
    ckpt: Path, model, monkeypatch: pytest.MonkeyPatch, error: BaseException, raised: type
) -> None:
    before = snapshot(ckpt)
    real = safetensors.torch.save_file

    def dies_mid_write(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:  # half the bytes made it to disk
            f.truncate(os.path.getsize(filename) // 2)
        raise error

    monkeypatch.setattr(safetensors.torch, "save_file", dies_mid_write)
    changed = zoo.build("gpt2-124m", **SIZES)
    with pytest.raises(raised) as excinfo:
        zoo.save(changed, ckpt)
    if raised is CheckpointError:
        assert "is unchanged" in str(excinfo.value) and "Free space" in str(excinfo.value)
    assert snapshot(ckpt) == before  # nothing replaced, no temporary files left
    monkeypatch.undo()
    loaded = zoo.load(ckpt)
    assert torch.equal(loaded.tok_emb.weight, model.tok_emb.weight)


def test_failed_first_save_leaves_nothing(tmp_path: Path, model, monkeypatch) -> None:
    def fails(*args, **kwargs):
        raise OSError("read-only file system")

    monkeypatch.setattr(safetensors.torch, "save_file", fails)
    with pytest.raises(CheckpointError, match="read-only"):
        zoo.save(model, tmp_path / "new")
    assert not (tmp_path / "new").exists()  # not even the folder (nor a lock file)


def test_an_empty_path_is_refused(model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """zoo.save(m, "") used to write into the current folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="empty path"):
        zoo.save(model, "")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format_version=True), "format_version True is not valid"),
        (lambda d: d["config"].update(layer_norm_eps=float("inf")), "must be a finite number"),
        (lambda d: d["config"].update(n_layers=10**9), "at most 4,096"),
        (lambda d: d["config"].update(context_length=2**62), "at most 16,777,216"),
    ],
)
def test_hostile_config_values_are_refused_before_building(ckpt: Path, edit, message: str) -> None:
    data = json.loads((ckpt / "config.json").read_text())
    edit(data)
    (ckpt / "config.json").write_text(json.dumps(data))
    with pytest.raises(zoo.ZooError, match=message):
        zoo.load(ckpt)


def test_a_deeply_nested_config_is_a_clear_error(ckpt: Path) -> None:
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        zoo.load(ckpt)


def safe_metadata(path: Path) -> dict[str, str]:
    with safetensors.safe_open(str(path), framework="pt") as f:
        return f.metadata()


def test_mixed_float_dtypes_are_a_clear_error_at_load(ckpt: Path) -> None:
    """float16 and float32 tensors in one file loaded fine, then the forward failed."""
    weights = ckpt / "model.safetensors"
    tensors = safetensors.torch.load_file(weights)
    metadata = safe_metadata(weights)
    first = next(iter(tensors))
    tensors[first] = tensors[first].half()
    target = weights.resolve()
    target.unlink()
    safetensors.torch.save_file(tensors, target, metadata=metadata)
    with pytest.raises(
        CheckpointError, match=r"mixes floating dtypes \(torch.float16, torch.float32\)"
    ):
        zoo.load(ckpt, verify=False)
    loaded = zoo.load(ckpt, verify=False, dtype=torch.float32)  # the fix the message gives
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}


def test_non_finite_weights_warn_naming_the_tensor(model, tmp_path: Path) -> None:
    with torch.no_grad():
        model.final_norm.weight[0] = float("nan")  # a diverged training run
    zoo.save(model, tmp_path)
    with pytest.warns(RuntimeWarning, match=r"NaN or infinite values \(final_norm\.weight"):
        zoo.load(tmp_path)
