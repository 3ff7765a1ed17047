"""Where CPU weights live (:mod:`zoo.kernels.pages`): :func:`resident` copies a tensor
memory-mapped from a weights file into the process's own memory with the same values (a
contiguous tensor chunk by chunk, a transposed view whole) and gives the file's pages back;
a tensor on the heap is copied and left as it was (``MADV_DONTNEED`` would zero it);
:func:`make_resident` moves a model's parameters and buffers, mapped or on the heap, into one
arena advised for huge pages, in place, tied parameters staying one, each tensor with a
storage of its own, the heap's memory given back."""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from zoo.checkpoint.files import read_safetensors
from zoo.kernels import pages

needs_maps = pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps (Linux)"
)


def _mapped(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    save_file(tensors, tmp_path / "w.safetensors")
    return read_safetensors(tmp_path / "w.safetensors")[0]


def _in_a_file(t: torch.Tensor) -> bool:
    start = t.data_ptr()
    return pages.in_file_mapping(start, start + t.numel() * t.element_size())


@needs_maps
@pytest.mark.parametrize("chunk", [4096, 1 << 20, 64 << 20])
def test_a_mapped_weight_becomes_the_processs_own_with_the_same_values(
    tmp_path: Path, monkeypatch, chunk: int
) -> None:
    """Chunks smaller than, around and larger than the tensor; values unchanged, the copy
    outside any file mapping, the source's values still readable (pages given back are read
    again from the file)."""
    monkeypatch.setattr(pages, "_CHUNK", chunk)
    want = torch.randn(3000, 257)  # (771,000 floats: not a whole number of pages or chunks)
    source = _mapped(tmp_path, {"w": want})["w"]
    assert _in_a_file(source)
    copy = pages.resident(source)
    assert torch.equal(copy, want) and copy.is_contiguous() and not _in_a_file(copy)
    assert torch.equal(source, want)


@needs_maps
def test_a_transposed_view_is_copied_whole_and_contiguous(tmp_path: Path) -> None:
    want = torch.randn(64, 300)
    view = _mapped(tmp_path, {"w": want})["w"].t()  # (300, 64), as a Conv1D layout reads it
    copy = pages.resident(view)
    assert copy.is_contiguous() and torch.equal(copy, want.t())


@needs_maps
def test_a_strided_view_is_copied_and_its_range_left_mapped(tmp_path: Path, monkeypatch):
    """Every other row of a mapped matrix: the range from its first to its last byte holds
    the rows between too, so no page of it is given back."""
    released: list[int] = []
    monkeypatch.setattr(pages, "_advise", lambda first, last, advice, unit: released.append(advice))
    want = torch.randn(600, 300)
    view = _mapped(tmp_path, {"w": want})["w"][::2]
    copy = pages.resident(view)
    assert torch.equal(copy, want[::2]) and copy.is_contiguous()
    assert pages._MADV_DONTNEED not in released


@needs_maps
def test_quantizing_a_transposed_mapped_weight_gives_all_its_pages_back(tmp_path, monkeypatch):
    """A Conv1D layout's weight (a transposed view of the file's bytes) quantized in chunks of
    rows, each of which touches every page: its whole range is given back once it is done
    (a range computed as if the view were contiguous gave back a chunk's worth and kept the
    rest: +124 MiB resident after loading gpt2-124m's Hugging Face folder as int8); a chunk
    alone, whose range holds the other rows' bytes, gives nothing back."""
    from zoo.quant import layers

    given: list[tuple[int, int]] = []
    monkeypatch.setattr(pages, "_give_back", lambda first, last: given.append((first, last)))
    monkeypatch.setattr(layers, "_CHUNK", 100)  # three chunks of rows
    want = torch.randn(64, 300)
    view = _mapped(tmp_path, {"w": want})["w"].t()  # (300, 64)
    q, _ = layers.int8_rows(view, release=True)
    start = view.data_ptr()
    assert given == [(start, start + want.numel() * 4)]
    assert torch.equal(q, layers.int8_rows(want.t().contiguous())[0])
    given.clear()
    pages.release_pages(view[:100])  # a chunk of rows of the transpose
    (tmp_path / "b").mkdir()
    pages.release_pages(_mapped(tmp_path / "b", {"w": want})["w"][::2])  # every other row
    assert given == []


def test_heap_memory_is_copied_and_left_as_it_was() -> None:
    heap = torch.arange(1 << 20, dtype=torch.float32)
    copy = pages.resident(heap)
    assert torch.equal(copy, heap) and copy.data_ptr() != heap.data_ptr()
    assert torch.equal(heap, torch.arange(1 << 20, dtype=torch.float32))


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping of ``/proc/self/smaps`` that holds ``address``."""
    inside = False
    with open("/proc/self/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _model_half_mapped(tmp_path: Path) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Two linear layers: the first's weight and bias and a buffer mapped from a file, the
    second on the heap."""
    model = nn.Sequential(nn.Linear(300, 200), nn.Linear(200, 300))
    model[1].weight = nn.Parameter(model[0].weight.detach().t().contiguous())  # no tie yet
    values = {k: v.clone() for k, v in model.state_dict().items()}
    mapped = _mapped(tmp_path, {k: v.contiguous() for k, v in values.items()})
    with torch.no_grad():
        model[0].weight.data = mapped["0.weight"]
        model[0].bias.data = mapped["0.bias"]
    model.register_buffer("table", mapped["1.bias"])
    values["table"] = values["1.bias"]
    return model, values


@needs_maps
def test_make_resident_moves_every_tensor_of_a_model_into_one_arena_in_place(tmp_path):
    """Mapped and heap tensors alike (a heap tensor on 4 KiB pages streams as slowly as a
    mapped one): the same objects with the same values, all inside one mapping advised for
    huge pages (``hg``), none left in the file; a second call moves nothing."""
    model, values = _model_half_mapped(tmp_path)
    model[1].alias = model[0].weight  # a second reference to one parameter: moved once
    param = model[0].weight
    moved = pages.make_resident(model)
    assert moved == 4 * (2 * 300 * 200 + 200 + 300 + 300)
    assert model[0].weight is param and model[1].alias is param  # in place: the same objects
    tensors = [*model.parameters(), *model.buffers()]
    assert not any(_in_a_file(t) for t in tensors)
    for key, value in values.items():
        assert torch.equal(model.state_dict()[key], value), key
    flags = {tuple(_vm_flags(t.data_ptr())) for t in tensors}
    assert len(flags) == 1
    if Path("/sys/kernel/mm/transparent_hugepage").exists():
        assert "hg" in flags.pop()
    assert pages.make_resident(model) == 0


@needs_maps
def test_tensors_in_an_arena_save_as_tensors_of_their_own(tmp_path: Path) -> None:
    """Each tensor taken from an arena has a storage of its own: safetensors finds no
    shared memory (it refuses to save tensors that share a storage) and saves each alone."""
    model, values = _model_half_mapped(tmp_path)
    pages.make_resident(model)
    state = model.state_dict()
    for t in state.values():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    save_file(state, tmp_path / "again.safetensors")
    again = read_safetensors(tmp_path / "again.safetensors")[0]
    assert again.keys() == values.keys()
    assert all(torch.equal(again[k], v) for k, v in values.items())
    (tmp_path / "one").mkdir()
    save_file({"w": model[1].weight}, tmp_path / "one" / "w.safetensors")
    assert (tmp_path / "one" / "w.safetensors").stat().st_size < 4 * 300 * 200 + 1024


@needs_maps
def test_an_arena_is_unmapped_with_its_last_tensor() -> None:
    model = nn.Linear(300, 200)
    pages.make_resident(model)
    start = model.weight.data_ptr()
    assert pages._in_arena(start, start + 4)
    del model
    gc.collect()
    assert not pages._in_arena(start, start + 4)


@needs_maps
@pytest.mark.parametrize("moved_in_inference_mode", [True, False])
@pytest.mark.parametrize("built_in_inference_mode", [False, True])
def test_a_moved_weight_keeps_its_kind_whatever_mode_decoding_runs_in(
    built_in_inference_mode: bool, moved_in_inference_mode: bool
) -> None:
    """Decoding sessions start under ``torch.inference_mode``: a weight moved there became an
    inference tensor, and the model could not be trained after a generation ("Inference
    tensors cannot be saved for backward"). A model built in inference mode stays as it was
    (a normal tensor under its parameters failed its forward)."""
    with torch.inference_mode(built_in_inference_mode):
        model = nn.Linear(8, 8)
    want = model.weight.detach().clone()
    with torch.inference_mode(moved_in_inference_mode):
        assert pages.make_resident(model) > 0
    assert torch.equal(model.weight, want)
    assert model.weight.is_inference() == model.bias.is_inference() == built_in_inference_mode
    if built_in_inference_mode:
        with torch.inference_mode():
            model(torch.ones(1, 8))
    else:
        model(torch.ones(1, 8)).sum().backward()
        assert model.weight.grad is not None


def test_a_model_trains_after_a_generation() -> None:
    import zoo
    from zoo.testing import small_overrides

    model = zoo.build("gpt2-124m", **small_overrides("gpt2-124m"))
    ids = torch.tensor([[1, 2, 3]])
    zoo.generate(model, ids, max_new_tokens=2, temperature=0)
    model.train()
    model(ids).float().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_no_address_space_for_an_arena_moves_nothing(monkeypatch) -> None:
    def refuse(nbytes: int) -> None:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(pages, "_Arena", refuse)
    model = nn.Linear(300, 200)
    where = model.weight.data_ptr()
    assert pages.make_resident(model) == 0 and model.weight.data_ptr() == where


_HEAP_CHILD = """
import ctypes, torch
from torch import nn
from zoo.kernels import pages
if {untrimmed}:
    pages._trim_heap = lambda: None
ctypes.CDLL(None).mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD: 1 MiB weights on the heap
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
model, keep = nn.Module(), []
for i in range(96):  # 96 MiB of weights, each between two tensors that stay
    model.register_buffer(f"w{{i}}", torch.ones(1 << 18))
    keep.append(torch.ones(256))
before = rss()
assert pages.make_resident(model) == 96 << 20
print((rss() - before) >> 20)
"""


@needs_maps
@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="needs glibc")
def test_weights_moved_off_the_heap_give_its_memory_back() -> None:
    """Weights on the heap between allocations that stay (as a model's are, among its
    modules' own) leave holes the allocator keeps unless trimmed: resident memory would hold
    the weights twice. In a child: the heap is its own, the allocator's thresholds set."""
    grown = {}
    for untrimmed in (False, True):
        child = subprocess.run(
            [sys.executable, "-c", _HEAP_CHILD.format(untrimmed=untrimmed)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == 0, child.stderr
        grown[untrimmed] = int(child.stdout.split()[-1])
    assert grown[False] < 24, grown  # MiB: the weights about once
    assert grown[True] > 72, grown  # (the check can fail: untrimmed, they are held twice)


@needs_maps
def test_weights_larger_than_the_memory_available_stay_mapped(tmp_path: Path, monkeypatch):
    """The mapping can be paged from the file, the process's own memory cannot: where the
    weights exceed what is available, nothing moves."""
    import zoo.memory

    model = nn.Linear(300, 200)
    mapped = _mapped(tmp_path, {"w": model.weight.detach().contiguous()})
    with torch.no_grad():
        model.weight.data = mapped["w"]
    monkeypatch.setattr(zoo.memory, "available_memory", lambda device="cpu": 1000)
    assert pages.make_resident(model) == 0 and _in_a_file(model.weight)


@needs_maps
def test_a_settled_model_is_not_looked_at_again_until_a_tensor_moves(tmp_path, monkeypatch):
    """Each decoding session calls make_resident: once a model's weights are in an arena, a
    call reads no /proc/self/maps; a tensor mapped from a file again is found and moved."""
    model = nn.Linear(300, 200)
    assert pages.make_resident(model) == 4 * (300 * 200 + 200)  # from the heap
    reads: list[int] = []
    real = pages._file_mappings
    monkeypatch.setattr(pages, "_file_mappings", lambda: reads.append(1) or real())
    assert pages.make_resident(model) == 0 and reads == []
    mapped = _mapped(tmp_path, {"w": model.weight.detach().contiguous()})
    with torch.no_grad():
        model.weight.data = mapped["w"]
    assert pages.make_resident(model) == 4 * 300 * 200 and reads == [1]
    assert not _in_a_file(model.weight)
