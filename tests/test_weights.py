"""Checkpoints: zoo.save / zoo.load round trips for every registered model, the loading
mechanics (meta build, memory map, ties, buffers), and the registry's named-model weights.

Hugging Face import/export parity is in ``test_weights_hf.py``; broken files in
``test_weights_faults.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn

import zoo
from zoo.checkpoint import files as ckfiles
from zoo.checkpoint.state import tied_groups
from zoo.config import ModelConfig
from zoo.errors import CheckpointError, ChecksumMismatchError, ConfigError
from zoo.nn import ZooModel
from zoo.plugin.current import load_registry
from zoo.testing.small import token_ids_within

MODELS = zoo.list_models()

#: Small sizes for the round trips (applied where the config has the field).
SMALL = {
    "n_layers": 1,
    "n_encoder_layers": 1,
    "n_decoder_layers": 1,
    "d_model": 64,
    "n_heads": 4,
    "d_ff": 128,
    "context_length": 64,
    "vocab_size": 512,
}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Keep the verification cache out of the user's home."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path_factory.mktemp("zoo-cache")))


def small(name: str, **extra):
    _, _, config = zoo.resolve_config(name)
    fields = type(config).field_names()
    torch.manual_seed(0)
    sizes = {k: v for k, v in SMALL.items() if k in fields}
    if getattr(config, "n_kv_heads", None) is not None:
        sizes["n_kv_heads"] = 2  # grouped-query attention stays grouped over the 4 heads
    layers = getattr(config, "n_layers", None)
    for field in fields:  # one value per layer (Gemma's layer_types): the first n_layers
        value = getattr(config, field)
        if isinstance(value, tuple) and layers and len(value) == layers and "n_layers" in sizes:
            sizes[field] = value[: sizes["n_layers"]]
    sizes |= token_ids_within(config, sizes)
    return zoo.build(name, **{**sizes, **extra}).eval()


def logits(model, seed: int = 0) -> torch.Tensor:
    inputs = model.example_inputs(generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(**inputs)


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key].cpu(), sb[key].cpu()), key


def visible(directory: Path) -> list[str]:
    """The names a user sees: zoo's own hidden entries (versions, lock) left out."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


# -- round trips, registry-driven ---------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_round_trip(name: str, tmp_path: Path) -> None:
    model = small(name)
    zoo.save(model, tmp_path)
    assert visible(tmp_path) == ["config.json", "model.safetensors"]
    loaded = zoo.load(tmp_path)

    assert not loaded.training
    assert type(loaded) is type(model)
    assert loaded.config == model.config
    assert loaded.name == model.name == zoo.get_registry().model(name).name
    assert_same_weights(model, loaded)
    assert torch.equal(logits(loaded), logits(model))
    assert tied_groups(loaded) == tied_groups(model)
    if getattr(model.config, "tie_embeddings", False):
        assert loaded.head.weight is loaded.tok_emb.weight
    assert not any(t.is_meta for t in [*loaded.parameters(), *loaded.buffers()])
    assert loaded.load_report.ok
    assert loaded.tokenizer is None  # shrunken vocabulary: the registry's tokenizer won't do

    manifest = json.loads((tmp_path / "config.json").read_text())
    assert manifest["format"] == "zoo" and manifest["format_version"] == 1
    assert manifest["zoo_version"] == zoo.__version__
    assert manifest["architecture"] == type(model.config).architecture
    assert manifest["model_name"] == model.name
    assert manifest["config"] == json.loads(json.dumps(model.config.to_dict()))  # tuples: lists
    assert manifest["tokenizer"] is None
    weights = manifest["weights"]
    assert weights["file"] == "model.safetensors" and weights["dtype"] == "float32"
    assert weights["sha256"] == ckfiles.sha256_file(tmp_path / "model.safetensors")
    assert weights["parameters"] == model.num_parameters()


@pytest.mark.parametrize("name", MODELS)
def test_dtype_and_device(name: str, tmp_path: Path) -> None:
    model = small(name)
    zoo.save(model, tmp_path)
    half = zoo.load(tmp_path, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert_same_weights(model.to(torch.bfloat16), half)
    assert tied_groups(half) == tied_groups(model)
    assert logits(half).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match=r"floating torch\.dtype"):
        zoo.load(tmp_path, dtype=torch.int64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", MODELS)
def test_cuda(name: str, tmp_path: Path) -> None:
    model = small(name)
    zoo.save(model, tmp_path)
    gpu = zoo.load(tmp_path, device="cuda", dtype=torch.float16)
    assert {p.device.type for p in gpu.parameters()} == {"cuda"}
    assert {p.dtype for p in gpu.parameters()} == {torch.float16}
    assert tied_groups(gpu) == tied_groups(model)
    torch.testing.assert_close(logits(gpu).float().cpu(), logits(model), atol=0.05, rtol=0.05)
    zoo.save(gpu, tmp_path / "from-gpu")  # saving copies to the CPU
    assert_same_weights(zoo.load(tmp_path / "from-gpu"), model.half())


def test_cpu_weights_are_the_memory_mapped_file_until_decoding(tmp_path: Path) -> None:
    """No second copy at load: every CPU parameter points into the mapping of
    model.safetensors (nothing read until used). The first decoding session moves them into
    the process's own memory (zoo.kernels.pages.make_resident: decoding streams them every
    step) with the same values, tied ones still one tensor; writing to a parameter never
    reaches the file."""
    from zoo.kernels.pages import _file_mappings
    from zoo.runtime import start_decoding

    if not Path("/proc/self/maps").exists():
        pytest.skip("needs /proc/self/maps")
    saved = small("gpt2-124m")
    zoo.save(saved, tmp_path)
    model = zoo.load(tmp_path)

    def mapped() -> list[bool]:
        ranges = _file_mappings()
        return [
            any(lo <= p.data_ptr() and p.data_ptr() + p.nbytes <= hi for lo, hi in ranges)
            for p in model.parameters()
        ]

    assert all(mapped())
    start_decoding(model, torch.tensor([[1, 2, 3]]), None, 4)
    assert not any(mapped())
    assert all(p.is_contiguous() for p in model.parameters())
    assert_same_weights(model, saved)
    assert tied_groups(model) == tied_groups(saved)
    p = next(model.parameters())
    before = ckfiles.sha256_file(tmp_path / "model.safetensors")
    with torch.no_grad():
        p.add_(1.0)
    assert ckfiles.sha256_file(tmp_path / "model.safetensors") == before


def test_load_builds_on_meta_without_initialising(tmp_path: Path, monkeypatch) -> None:
    zoo.save(small("gpt2-124m"), tmp_path)
    seen: list[str] = []
    original = nn.init.normal_

    def spy(tensor, *args, **kwargs):
        seen.append(tensor.device.type)
        return original(tensor, *args, **kwargs)

    monkeypatch.setattr(nn.init, "normal_", spy)
    zoo.load(tmp_path)
    assert "cpu" not in seen  # nothing initialised for real, only (skipped) meta calls


def test_save_overwrites_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    first, second = small("gpt2-124m"), small("gpt2-124m")
    with torch.no_grad():
        second.tok_emb.weight.add_(1.0)
    zoo.save(first, tmp_path)
    zoo.save(second, tmp_path)
    assert visible(tmp_path) == ["config.json", "model.safetensors"]
    assert_same_weights(zoo.load(tmp_path), second)


def test_save_over_the_checkpoint_a_model_was_loaded_from(tmp_path: Path) -> None:
    """The loaded weights are a memory map of the old file: saving replaces the file (new
    inode), so the model in memory stays intact."""
    model = small("gpt2-124m")
    zoo.save(model, tmp_path)
    loaded = zoo.load(tmp_path)
    with torch.no_grad():
        loaded.final_norm.bias.add_(1.0)
    zoo.save(loaded, tmp_path)
    assert torch.equal(loaded.tok_emb.weight, model.tok_emb.weight)
    again = zoo.load(tmp_path)
    assert torch.equal(again.final_norm.bias, model.final_norm.bias + 1.0)
    assert torch.equal(again.tok_emb.weight, model.tok_emb.weight)


def test_weights_file_alone_loads_from_its_metadata(tmp_path: Path) -> None:
    model = small("wiki-gpt-wordpiece")
    zoo.save(model, tmp_path / "ckpt")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(tmp_path / "ckpt" / "model.safetensors", alone / "weights.safetensors")
    loaded = zoo.load(alone / "weights.safetensors")
    assert torch.equal(logits(loaded), logits(model))


def test_save_refuses_meta_and_foreign_models(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="meta device"):
        zoo.save(zoo.build("gpt2-124m", device="meta", **{"n_layers": 1}), tmp_path)
    with pytest.raises(CheckpointError, match="no zoo config"):
        zoo.save(nn.Linear(2, 2), tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- the verification cache -----------------------------------------------------------------
def test_verified_file_is_not_hashed_again_until_it_changes(tmp_path: Path, monkeypatch):
    original = small("gpt2-124m")
    zoo.save(original, tmp_path)
    weights = tmp_path / "model.safetensors"
    old = weights.stat().st_mtime - 60
    os.utime(weights, (old, old))  # settled: old enough to be remembered
    hashed: list[Path] = []
    real = ckfiles.BackgroundHash

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, expected: dict[Path, str], *, what: str) -> None:
            hashed.extend(expected)
            super().__init__(expected, what=what)

    monkeypatch.setattr("zoo.checkpoint.load.BackgroundHash", Counting)
    zoo.load(tmp_path)
    zoo.load(tmp_path)
    assert len(hashed) == 1
    zoo.load(tmp_path, verify=True)
    assert len(hashed) == 2
    with open(weights, "r+b") as f:  # corrupt one weight byte: mtime moves
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        zoo.load(tmp_path)
    # the opt-out, at the user's risk: the corrupted bytes load as they are, unchecked
    unchecked = zoo.load(tmp_path, verify=False).state_dict()
    changed = [k for k, v in original.state_dict().items() if not torch.equal(v, unchecked[k])]
    assert changed and len({unchecked[k].data_ptr() for k in changed}) == 1  # one (tied) tensor


# -- buffers: the plugin-author convention --------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class BufferedConfig(ModelConfig):
    architecture: ClassVar[str] = "buffered-test"
    vocab_size: int = 32
    d_model: int = 8


class _Table(nn.Module):
    """A non-persistent table recreated by ``reset_buffers`` (the preferred convention)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.reset_buffers()

    def reset_buffers(self) -> None:
        self.register_buffer("scale", torch.arange(1, self.d_model + 1) / 4.0, persistent=False)


class BufferedLM(ZooModel):
    def __init__(self, config: BufferedConfig) -> None:
        super().__init__(config)
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.table = _Table(config.d_model)
        # no reset_buffers for these: zoo rebuilds them by running the constructor again
        self.register_buffer("offset", torch.linspace(-1, 1, config.d_model), persistent=False)
        self.register_buffer("counts", torch.full((config.d_model,), 3.0))  # persistent
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def example_inputs(self, batch_size=2, seq_len=8, *, generator=None):
        ids = torch.randint(0, self.config.vocab_size, (batch_size, seq_len), generator=generator)
        return {"input_ids": ids.to(self.tok_emb.weight.device)}

    def forward(self, input_ids):
        x = self.tok_emb(input_ids) * self.table.scale + self.offset + self.counts
        return self.head(x)


class _BufferedPlugin:
    @zoo.hookimpl
    def zoo_architectures(self):
        return [zoo.ArchitectureSpec(name="buffered-test", config=BufferedConfig, model=BufferedLM)]


@pytest.fixture
def buffered_registry(monkeypatch, use_registry):

    registry = load_registry(plugins={"buffered": _BufferedPlugin()})
    use_registry(registry)
    return registry


def test_non_persistent_buffers_are_recreated(tmp_path: Path, buffered_registry) -> None:
    torch.manual_seed(0)
    model = zoo.build(BufferedConfig()).eval()
    with torch.no_grad():
        model.counts.fill_(7.0)  # a persistent buffer travels with the weights
    zoo.save(model, tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "counts" in f.keys() and "offset" not in f.keys()  # noqa: SIM118
    for dtype in (None, torch.bfloat16):
        loaded = zoo.load(tmp_path, dtype=dtype)
        assert not any(b.is_meta for b in loaded.buffers())
        want = dtype or torch.float32
        assert torch.equal(loaded.table.scale, model.table.scale.to(want))
        assert torch.equal(loaded.offset, model.offset.to(want))
        assert torch.equal(loaded.counts, torch.full((8,), 7.0, dtype=want))
    assert torch.equal(logits(zoo.load(tmp_path)), logits(model))


def test_unknown_architecture_names_the_plugin(
    tmp_path: Path, buffered_registry, monkeypatch, use_registry
):
    import zoo.plugin.current

    zoo.save(zoo.build(BufferedConfig()), tmp_path)
    manifest = json.loads((tmp_path / "config.json").read_text())
    assert manifest["plugin"] == {"name": "buffered", "distribution": None}
    manifest["plugin"] = {"name": "buffered", "distribution": "zoo-buffered 0.3"}
    (tmp_path / "config.json").write_text(json.dumps(manifest))
    use_registry(load_registry())  # plugin uninstalled
    with pytest.raises(zoo.UnknownArchitectureError, match=r"\(pip install zoo-buffered\)"):
        zoo.load(tmp_path)
    # a hostile checkpoint cannot make zoo suggest an arbitrary pip argument
    manifest["plugin"] = {"name": "buffered", "distribution": "--index-url=http://evil/ x 1"}
    (tmp_path / "config.json").write_text(json.dumps(manifest))
    with pytest.raises(zoo.UnknownArchitectureError) as excinfo:
        zoo.load(tmp_path)
    assert "pip install" not in str(excinfo.value) and "evil" not in str(excinfo.value)


def test_a_folder_named_like_a_model_does_not_shadow_it(tmp_path: Path, monkeypatch) -> None:
    """./gpt2-124m/ in the current directory silently replaced the official weights of
    zoo.load("gpt2-124m"); a bare name now means the named model, ./name the folder."""
    monkeypatch.chdir(tmp_path)
    impostor = small("gpt2-124m")
    zoo.save(impostor, tmp_path / "gpt2-124m")
    monkeypatch.delenv("ZOO_WEIGHTS_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(zoo.HubOfflineError):  # the named model: its official Hub weights
        zoo.load("gpt2-124m")
    loaded = zoo.load("./gpt2-124m")  # spelled as a path: the folder
    assert torch.equal(loaded.head.weight, impostor.head.weight)


# -- named models with local weights --------------------------------------------------------
def _user_registry(path: Path, body: str, monkeypatch) -> None:
    path.write_text(body)
    monkeypatch.setenv("ZOO_REGISTRY_PATH", str(path))
    zoo.reset_registry()


def test_named_model_from_registry_path_with_pinned_sha(tmp_path: Path, monkeypatch) -> None:
    model = small("gpt2-124m")
    zoo.save(model, tmp_path / "w")
    sha = ckfiles.sha256_file(tmp_path / "w" / "model.safetensors")
    config = ", ".join(f"{k} = {v}" for k, v in model.config.to_dict().items() if k in SMALL)
    try:
        _user_registry(
            tmp_path / "reg.toml",
            f'[models.my-gpt2]\narchitecture = "gpt2"\nconfig = {{{config}}}\n'
            f'weights = {{path = "{tmp_path / "w"}", sha256 = "{sha}"}}\n'
            f'[models.my-bad]\narchitecture = "gpt2"\nconfig = {{{config}}}\n'
            f'weights = {{path = "{tmp_path / "w"}", sha256 = "{"0" * 64}"}}\n'
            f'[models.my-none]\narchitecture = "gpt2"\nconfig = {{{config}}}\n',
            monkeypatch,
        )
        loaded = zoo.load("my-gpt2")
        assert loaded.name == "my-gpt2"
        assert torch.equal(logits(loaded), logits(model))
        with pytest.raises(ChecksumMismatchError, match="pinned sha256"):
            zoo.load("my-bad")
        with pytest.raises(CheckpointError, match="ZOO_WEIGHTS_DIR"):
            zoo.load("my-none")
        monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(tmp_path / "dir"))
        zoo.save(model, tmp_path / "dir" / "my-none")
        assert torch.equal(logits(zoo.load("my-none")), logits(model))
    finally:
        monkeypatch.delenv("ZOO_REGISTRY_PATH")
        zoo.reset_registry()


def test_unknown_source_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(zoo.UnknownModelError, match="not-a-model"):
        zoo.load("not-a-model")
    with pytest.raises(CheckpointError, match="does not exist"):
        zoo.load(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        zoo.load(tmp_path)


# -- tokenizers travel with the weights -----------------------------------------------------
def test_trained_tokenizer_is_saved_with_the_weights(tmp_path: Path) -> None:
    from zoo.tokenizers import SubwordBPE

    texts = ["the cat sat on the mat", "a dog sat on a log", "the cat and the dog"] * 20
    tok = SubwordBPE.train(texts, vocab_size=300)
    model = small("transformer-encdec-tiny", vocab_size=tok.vocab_size)
    zoo.save(model, tmp_path, tokenizer=tok)
    manifest = json.loads((tmp_path / "config.json").read_text())
    assert manifest["tokenizer"]["name"] == "subword-bpe" and manifest["tokenizer"]["files"]
    loaded = zoo.load(tmp_path)
    assert loaded.tokenizer.encode("the cat sat") == tok.encode("the cat sat")
    zoo.save(loaded, tmp_path / "again")  # model.tokenizer is saved by default
    assert zoo.load(tmp_path / "again").tokenizer.encode("a dog") == tok.encode("a dog")
    assert zoo.load(tmp_path, tokenizer=False).tokenizer is None
    for name in manifest["tokenizer"]["files"]:
        (tmp_path / name).unlink()
    with pytest.raises(CheckpointError, match="tokenizer"):
        zoo.load(tmp_path)


def test_named_model_tokenizer_comes_from_the_registry(tmp_path: Path) -> None:
    model = small("gpt2-124m", vocab_size=50257)
    zoo.save(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["tokenizer"] is None
    loaded = zoo.load(tmp_path)
    assert loaded.tokenizer.encode("Hello world") == [15496, 995]
    zoo.save(loaded, tmp_path / "again")
    spec = json.loads((tmp_path / "again" / "config.json").read_text())["tokenizer"]
    assert spec == {"name": "gpt2-bpe"}
    assert zoo.load(tmp_path / "again").tokenizer.encode("Hello world") == [15496, 995]


def test_named_model_with_hf_layout_weights(tmp_path: Path, monkeypatch) -> None:
    """A registry entry whose local weights are in a Hugging Face layout, with or without
    their config.json (what a Hub download of bare weights hands to load_local)."""
    model = small("gpt2-124m")
    zoo.export(model, tmp_path / "w")
    config = ", ".join(f"{k} = {v}" for k, v in model.config.to_dict().items() if k in SMALL)
    try:
        _user_registry(
            tmp_path / "reg.toml",
            f'[models.my-hf]\narchitecture = "gpt2"\nconfig = {{{config}}}\n'
            f'weights = {{path = "{tmp_path / "w"}", layout = "hf-gpt2"}}\n',
            monkeypatch,
        )
        assert torch.equal(logits(zoo.load("my-hf")), logits(model))
        (tmp_path / "w" / "config.json").unlink()
        loaded = zoo.load("my-hf")
        assert loaded.name == "my-hf"
        assert torch.equal(logits(loaded), logits(model))
        with pytest.raises(CheckpointError, match=r"no config\.json"):
            zoo.load(tmp_path / "w")  # without the named model, nothing says what it is
    finally:
        monkeypatch.delenv("ZOO_REGISTRY_PATH")
        zoo.reset_registry()


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_every_checkpoint_file_honours_the_umask(tmp_path: Path, umask: int) -> None:
    """safetensors writes its file 0600 while config.json got 0644: a checkpoint shared with
    a group or the world was half unreadable."""
    old = os.umask(umask)
    try:
        zoo.save(small("gpt2-124m"), tmp_path / "ckpt")
    finally:
        os.umask(old)
    modes = {
        name: stat.S_IMODE((tmp_path / "ckpt" / name).stat().st_mode)
        for name in visible(tmp_path / "ckpt")
    }
    assert modes == {name: 0o666 & ~umask for name in modes}
    assert {"model.safetensors", "config.json"} <= set(modes)
