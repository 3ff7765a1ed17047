"""Where CPU weights live (:mod:`zoo.kernels.pages`): :func:`resident` copies a tensor
memory-mapped from a weights file into the process's own memory with the same values (a
contiguous tensor chunk by chunk, a transposed view whole) and gives the file's pages back;
a tensor on the heap is copied and left as it was (``MADV_DONTNEED`` would zero it);
:func:`make_resident` moves exactly a model's file-mapped parameters and buffers, in place,
tied parameters staying one."""

from __future__ import annotations

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


@needs_maps
def test_make_resident_moves_the_mapped_tensors_of_a_model_in_place(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(300, 200), nn.Linear(200, 300))
    model[1].weight = nn.Parameter(model[0].weight.detach().t().contiguous())  # no tie yet
    values = {k: v.clone() for k, v in model.state_dict().items()}
    mapped = _mapped(tmp_path, {k: v.contiguous() for k, v in values.items()})
    with torch.no_grad():
        model[0].weight.data = mapped["0.weight"]
        model[0].bias.data = mapped["0.bias"]  # the second layer stays on the heap
    heap = model[1].weight.data_ptr()
    model.register_buffer("table", mapped["1.bias"])
    model[1].alias = model[0].weight  # a second reference to one parameter: moved once
    param = model[0].weight
    moved = pages.make_resident(model)
    assert moved == 4 * (300 * 200 + 200 + 300)
    assert model[0].weight is param and model[1].alias is param  # in place: the same objects
    assert not any(_in_a_file(t) for t in (*model.parameters(), *model.buffers()))
    assert model[1].weight.data_ptr() == heap  # not mapped: untouched
    for key, value in values.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert pages.make_resident(model) == 0


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
    """Each decoding session calls make_resident: once a model's weights are its own, a call
    reads no /proc/self/maps; a tensor mapped from a file again is found and moved."""
    model = nn.Linear(300, 200)
    assert pages.make_resident(model) == 0  # nothing mapped: settled as it is
    reads: list[int] = []
    real = pages._file_mappings
    monkeypatch.setattr(pages, "_file_mappings", lambda: reads.append(1) or real())
    assert pages.make_resident(model) == 0 and reads == []
    mapped = _mapped(tmp_path, {"w": model.weight.detach().contiguous()})
    with torch.no_grad():
        model.weight.data = mapped["w"]
    assert pages.make_resident(model) == 4 * 300 * 200 and reads == [1]
    assert not _in_a_file(model.weight)
