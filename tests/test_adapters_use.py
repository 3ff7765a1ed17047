"""Using LoRA adapters: ``zoo.load(SOURCE, adapter=...)`` from a folder, a
LoRA run's folder or the Hub; ``zoo.merge`` and ``zoo merge``; ``--adapter`` on ``zoo
generate``; ``zoo info ADAPTER``; ``zoo push`` of an adapter and the pull back, with hostile
Hub answers refused. A tiny Llama-shaped model (``llama-tiny``, byte tokenizer) and adapters
made with :mod:`zoo.adapters.lora` and :func:`zoo.adapters.save_adapter`."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from hubserver import LocalHub
from torch import Tensor

import zoo
from zoo.adapters import BaseRecord, base_fingerprint, per_part, save_adapter
from zoo.adapters.lora import adapted_layers, adapter_parameters, attach_lora, plan_lora
from zoo.cli import main

IDS = torch.tensor([[5, 17, 99, 3, 250, 42, 7]])
LORA = zoo.LoRA(rank=4, alpha=8.0, targets=("attn.qkv", "attn.proj", "ffn.fc"))


def _adapter(base: Path, folder: Path, *, name: str | None, sha256: str | None = None) -> Tensor:
    """An adapter with non-zero weights for the model in ``base``, saved to ``folder``
    (recording ``name`` and the model's fingerprint, or ``sha256``); the adapted logits."""
    model = zoo.load(base, onednn=False)
    record = BaseRecord(
        name=name, repo=None, revision=None, sha256=sha256 or base_fingerprint(model)
    )
    attach_lora(model, plan_lora(model, LORA, per_part=per_part(model)))
    torch.manual_seed(1)
    with torch.no_grad():
        for _, p in adapter_parameters(model):
            p.normal_(0.0, 0.1)
        logits = model(IDS)
    save_adapter(model, folder, base=record, lora=LORA)
    return logits


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """``llama-tiny``'s weights in a ``$ZOO_WEIGHTS_DIR`` (so the name loads them), a LoRA
    run's folder whose adapter records that name, and the adapted logits."""
    root = tmp_path_factory.mktemp("adapters")
    torch.manual_seed(0)
    model = zoo.build("llama-tiny").eval()
    base = zoo.save(model, root / "weights" / "llama-tiny")
    logits = _adapter(base, root / "run" / "adapter", name="llama-tiny")
    return {"root": root, "base": base, "adapter": root / "run" / "adapter", "logits": logits}


@pytest.fixture(autouse=True)
def _weights_dir(made: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(made["root"] / "weights"))
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))


def _logits(model: torch.nn.Module) -> Tensor:
    with torch.no_grad():
        return model(IDS)


def test_load_with_an_adapter_equals_attaching_it(made: dict) -> None:
    for source in (made["base"], "llama-tiny"):
        model = zoo.load(source, adapter=made["adapter"])
        assert torch.equal(_logits(model), made["logits"])
        assert len(adapted_layers(model)) == 2 * 3  # 2 layers x (qkv, proj, fc)
    # a LoRA run's folder (or its adapter/) alone: the base comes from the record, by name
    for source in (made["root"] / "run", made["adapter"]):
        model = zoo.load(source)
        assert torch.equal(_logits(model), made["logits"])
        assert model.tokenizer is not None and model.tokenizer.name == "byte"


def test_quantized_base_is_checked_before_quantizing(made: dict, tmp_path: Path) -> None:
    model = zoo.load(made["base"], adapter=made["adapter"], quantize="int8")
    assert type(model.blocks[0].attn.qkv).__name__ != "Linear" and adapted_layers(model)
    assert torch.allclose(_logits(model), made["logits"], atol=0.05)
    other = tmp_path / "other"
    _adapter(made["base"], other, name=None, sha256="0" * 64)
    with pytest.raises(zoo.CheckpointError, match=r"sha256 000000000000.*not on this model"):
        zoo.load(made["base"], adapter=other, quantize="int8")


def test_a_wrong_base_is_refused_naming_both(made: dict, tmp_path: Path) -> None:
    torch.manual_seed(3)
    other = zoo.save(zoo.build("llama-tiny").eval(), tmp_path / "other-base")
    with pytest.raises(zoo.CheckpointError, match=r"trained on llama-tiny, sha256 \w{12}.*sha256"):
        zoo.load(other, adapter=made["adapter"])
    with pytest.raises(zoo.CheckpointError, match=r"no LoRA adapter|has no adapter_config"):
        zoo.load(made["base"], adapter=tmp_path)


def test_merge_equals_the_adapted_model(made: dict, tmp_path: Path) -> None:
    merged = zoo.merge(made["base"], made["adapter"])
    assert not adapted_layers(merged)
    assert set(merged.state_dict()) == set(zoo.load(made["base"]).state_dict())
    torch.testing.assert_close(_logits(merged), made["logits"], atol=1e-5, rtol=0)
    out = tmp_path / "merged"
    assert main(["merge", str(made["base"]), str(made["adapter"]), str(out)]) == 0
    again = zoo.load(out)
    assert torch.equal(_logits(again), _logits(merged)) and again.tokenizer.name == "byte"


def test_generate_with_adapter_equals_generate_on_the_merged_model(
    made: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--max-new-tokens", "12", "--temperature", "0"]
    assert (
        main(["generate", str(made["base"]), "Once", *flags, "--adapter", str(made["adapter"])])
        == 0
    )
    merged = zoo.merge(made["base"], made["adapter"])
    want = zoo.generate(merged, "Once", max_new_tokens=12, temperature=0)
    assert capsys.readouterr().out == "Once" + want + "\n"
    assert main(["generate", "llama-tiny", "x", "--random", "--adapter", str(made["adapter"])]) == 2
    assert "leave out --random" in capsys.readouterr().err


def test_info_of_an_adapter(made: dict, capsys: pytest.CaptureFixture[str]) -> None:
    info = zoo.info(str(made["root"] / "run"))
    adapter = info.adapter
    assert adapter is not None and info.architecture == "llama"
    assert (adapter.base_name, adapter.rank, adapter.alpha) == ("llama-tiny", 4, 8.0)
    assert adapter.base_sha256 == base_fingerprint(zoo.load(made["base"], onednn=False))
    assert set(adapter.targets) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"}
    # 2 layers x (q, k, v, o: A (4, 64) + B (out, 4); gate, up: A (4, 64) + B (160, 4))
    assert adapter.parameters == sum(
        p.numel() for _, p in adapter_parameters(zoo.load(made["adapter"]))
    )
    assert adapter.size == sum(
        (made["adapter"] / f).stat().st_size
        for f in ("adapter_config.json", "adapter_model.safetensors")
    )
    assert main(["info", str(made["adapter"])]) == 0
    out = capsys.readouterr().out
    assert "a LoRA adapter (rank 4) for llama-tiny" in out and "size on disk" in out
    assert "base model:" in out and "llama" in out


def test_push_and_pull_an_adapter(
    made: dict, local_hub: LocalHub, hub_offline: Callable[[bool], None]
) -> None:
    ref = zoo.push(made["root"] / "run", "org/tiny-lora")
    files = set(local_hub.list_files("org/tiny-lora", ref.sha)) - {".gitattributes"}
    assert files == {"README.md", "adapter_config.json", "adapter_model.safetensors"}
    card = local_hub.read_file("org/tiny-lora", "README.md", ref.sha).decode()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["library_name"] == "peft" and "lora" in meta["tags"]
    assert "llama-tiny" in card and "sha256" in card
    model = zoo.load("llama-tiny", adapter=ref.source)
    assert torch.equal(_logits(model), made["logits"])
    info = zoo.info(ref.source)
    assert info.adapter is not None and info.adapter.base_name == "llama-tiny"
    with pytest.raises(zoo.HubNotFoundError, match=r"LoRA adapter.*adapter="):
        zoo.load("hf:org/tiny-lora")  # an adapter is no model: says how to load it
    hub_offline(True)  # a warm cache serves the pinned adapter without the Hub
    seen = len(local_hub.requests)
    assert torch.equal(_logits(zoo.load("llama-tiny", adapter=ref.source)), made["logits"])
    assert len(local_hub.requests) == seen


def _pushed(made: dict, local_hub: LocalHub, tmp_path: Path, readme: bytes | None = None) -> Path:
    files: dict[str, bytes | Path] = {
        f: made["adapter"] / f for f in ("adapter_config.json", "adapter_model.safetensors")
    }
    if readme is not None:
        files["README.md"] = readme
    local_hub.add_files("org/evil", files)
    return tmp_path / "hf_home" / "hub" / "models--org--evil"


def test_a_hostile_etag_cannot_place_the_adapter_outside_the_cache(
    made: dict, local_hub: LocalHub, tmp_path: Path
) -> None:
    cache = _pushed(made, local_hub, tmp_path)
    target = tmp_path / "site-packages" / "evil.pth"
    target.parent.mkdir()
    blobs = cache / "blobs"
    blobs.mkdir(parents=True)
    etag = f'"{os.path.relpath(target, blobs)}"'  # ../../../site-packages/evil.pth
    local_hub.download_headers["adapter_model.safetensors"] = {"ETag": etag, "X-Linked-Etag": etag}
    with pytest.raises(zoo.UnsafeCheckpointError, match="ETag"):
        zoo.load("llama-tiny", adapter="hf:org/evil")
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_an_oversized_card_is_refused(
    made: dict, local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _pushed(made, local_hub, tmp_path, readme=b"#" * 40_000)
    monkeypatch.setenv("ZOO_HUB_MAX_FILE_BYTES", "8000")
    with pytest.raises(zoo.UnsafeCheckpointError, match=r"README\.md.*8,000-byte"):
        zoo.load("llama-tiny", adapter="hf:org/evil")
    assert not any(p.stat().st_size > 8000 for p in cache.rglob("*") if p.is_file())


def test_a_corrupted_adapter_download_is_refused_and_evicted(
    made: dict, local_hub: LocalHub, tmp_path: Path
) -> None:
    cache = _pushed(made, local_hub, tmp_path)
    local_hub.corrupt_file("org/evil", "adapter_model.safetensors")
    with pytest.raises(zoo.ChecksumMismatchError):
        zoo.load("llama-tiny", adapter="hf:org/evil")
    assert not [p for p in cache.rglob("adapter_model.safetensors")]
    local_hub.clear_faults()
    model = zoo.load("llama-tiny", adapter="hf:org/evil")  # the next try fetches it again
    assert torch.equal(_logits(model), made["logits"])


def test_a_chat_fine_tunes_tokenizer_comes_with_its_adapter(made: dict, tmp_path: Path) -> None:
    """A LoRA run's tokenizer/ (a chat template given at training) replaces the base's."""
    from chat_folders import write_folder

    run = tmp_path / "run"
    shutil.copytree(made["adapter"], run / "adapter", symlinks=True)
    write_folder(run / "tokenizer", "qwen2.5-instruct")
    model = zoo.load("llama-tiny", adapter=run)
    assert model.tokenizer.chat_template is not None
    assert zoo.load(made["base"], adapter=made["adapter"]).tokenizer.chat_template is None


def test_merge_writes_a_hugging_face_base_in_its_own_layout(made: dict, tmp_path: Path) -> None:
    hf_base = zoo.export(zoo.load(made["base"]), tmp_path / "hf-base")  # the same weights
    out = tmp_path / "merged-hf"
    assert main(["merge", str(hf_base), str(made["adapter"]), str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    torch.testing.assert_close(_logits(zoo.load(out)), made["logits"], atol=1e-5, rtol=0)


def test_a_peft_adapter_alone_loads_the_base_it_names(tmp_path: Path) -> None:
    """peft records the base by ``base_model_name_or_path`` (here a local folder), and no
    fingerprint: zoo.load(ADAPTER) loads that base, then the adapter, with peft's logits."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from test_families import reference

    reference("smollm2-like", tmp_path / "base")
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")  # its path kept
    torch.manual_seed(2)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    theirs = peft.get_peft_model(base, config).eval()
    theirs.save_pretrained(tmp_path / "adapter")
    model = zoo.load(tmp_path / "adapter")
    with torch.no_grad():
        diff = (model(IDS) - theirs(IDS).logits).abs().max().item()
    assert diff <= 1e-5
    adapter = zoo.info(str(tmp_path / "adapter")).adapter
    assert adapter is not None and adapter.base_sha256 is None and adapter.rank == 4
    assert adapter.base_repo == str(tmp_path / "base")


def test_the_adapter_card_names_the_base_as_the_hub_expects() -> None:
    from zoo.hub.card import adapter_card

    def metadata(config: dict, base: dict) -> dict:
        return yaml.safe_load(adapter_card(config, base, "org/x").split("---")[1])

    named = metadata({"r": 8}, {"name": "gpt2-124m", "sha256": "ab" * 32})
    assert named["base_model"] == "openai-community/gpt2"  # the named model's weights repo
    assert named["library_name"] == "peft" and "lora" in named["tags"]
    peft_written = {"r": 8, "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M"}
    assert metadata(peft_written, {})["base_model"] == "HuggingFaceTB/SmolLM2-135M"
    local = {"r": 8, "base_model_name_or_path": "/home/me/base"}
    assert "base_model" not in metadata(local, {})  # a local path is no Hub repo
