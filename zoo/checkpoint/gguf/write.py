"""Writing a zoo model as a GGUF file that llama.cpp, ollama and LM Studio run.

The model goes through its Hugging Face layout (:func:`zoo.checkpoint.write.foreign_form`,
what :func:`zoo.export` writes) and from there as llama.cpp's ``convert_hf_to_gguf.py``
converts such a folder: the ``config.json`` values under the family's metadata keys, each
tensor under the ``gguf`` package's name with llama.cpp's transforms
(:mod:`zoo.checkpoint.gguf.families`), the tokenizer and chat template in the metadata
(:mod:`zoo.checkpoint.gguf.vocab`), and the converter's choice of type per tensor: one-dimensional
tensors, norms, biases, position embeddings and a mixture's router in float32, every other
weight in the type asked (a quantized type whose blocks do not divide a row falls back to
float16, as the converter's does). q8_0 and q4_0 blocks are the ``gguf`` package's
quantizers, the ones llama.cpp's converter calls.

The file is written beside its destination and renamed into place, with the permissions
the process's umask gives: a killed write leaves the destination as it was, and the next
write of it removes the partial file the killed one left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import CheckpointError
from ...options import GGUF_TYPES
from ..commit import process_umask
from .families import Family, family_for_model_type

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor, nn

__all__ = ["GGUF_TYPES", "write_gguf"]

#: llama.cpp's file type for each of :data:`GGUF_TYPES`.
_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16",
               "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0"}  # fmt: skip
#: GGUF tensors kept in float32 whatever the type (as llama.cpp's converter keeps them).
_ALWAYS_F32 = re.compile(r"(_norm\.weight|\.bias|^position_embd\.weight|\.ffn_gate_inp\.weight)$")


def write_gguf(model: nn.Module, path: str | os.PathLike[str], *, type: str = "f32") -> Path:
    """Write ``model`` to the GGUF file ``path`` in ``type`` (:data:`GGUF_TYPES`).

    A tokenizer with no faithful GGUF form is a warning saying why; the weights are written.

    Raises:
        CheckpointError: the model's family has no GGUF form zoo writes, or its Hugging Face
            layout cannot hold it.
        ValueError: ``type`` is not one of :data:`GGUF_TYPES`.
    """
    import gguf
    import numpy as np

    from ..hf_form import foreign_form

    if type not in GGUF_TYPES:
        raise ValueError(f"type must be one of {', '.join(GGUF_TYPES)}, got {type!r}")
    _, hf, state = foreign_form(model, None)
    try:
        family = family_for_model_type(str(hf["model_type"]))
        _check_held(family, hf)
        values = _metadata_values(family, hf)
    except ValueError as exc:
        raise CheckpointError(f"zoo writes no GGUF of this model: {exc}") from None
    planned = _tensors(family, hf, state, type)  # every name and shape before any file
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep(target)
    fd, partial = tempfile.mkstemp(
        prefix=f".{target.name}.{os.getpid()}.", suffix=".partial", dir=target.parent
    )
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(partial, family.arch)
        _write_metadata(writer, model, values, type)
        for tensor in planned:
            info = (tensor.name, tensor.shape, np.dtype(np.float32), _nbytes(tensor))
            writer.add_tensor_info(*info, raw_dtype=tensor.qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in planned:
            writer.write_tensor_data(_typed(tensor))
        writer.close()
        with open(partial, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(partial, 0o666 & ~process_umask())  # as a file opened for writing gets (not 0600)
        os.replace(partial, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    return target


def _sweep(target: Path) -> None:
    """Remove what a killed write of ``target`` left beside it: its partial files whose
    writing process is gone (a live one's is its own, still being written)."""
    import glob

    for partial in target.parent.glob(f".{glob.escape(target.name)}.*.partial"):
        pid = partial.name[len(target.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _check_held(family: Family, hf: Mapping[str, Any]) -> None:
    """A ``ValueError`` naming what of ``config.json`` the GGUF architecture cannot hold."""
    family.check_held(hf)
    written = hf.get("layer_types")
    if family.swa_period and written is not None:
        pattern = family.layer_types(len(written))
        if list(written) != pattern:
            raise ValueError(
                f"its layers are {list(written)}; llama.cpp's {family.arch!r} slides all "
                f"layers but one in every {family.swa_period} ({pattern})"
            )
    given = (hf.get("rope_scaling"), hf.get("rope_parameters"))
    tables = [table for table in given if isinstance(table, Mapping)]
    tables += [inner for t in tables for inner in t.values() if isinstance(inner, Mapping)]
    kinds = {table.get("rope_type", table.get("type")) for table in tables} - {None, "default"}
    if kinds:
        raise ValueError(f"its rotary positions are scaled ({', '.join(sorted(kinds))})")


def _metadata_values(family: Family, hf: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture's metadata: each key of the family's table from ``config.json``
    (the first of two naming one GGUF key), then the derived ones; a ``ValueError`` where
    llama.cpp cannot hold a value."""
    prefix = f"{family.arch}."
    values: dict[str, Any] = {}
    for key, hf_key in family.keys:
        value = _hf_value(hf, hf_key)
        if value is not None:
            values.setdefault(prefix + key, value)
    for key, _, write in family.derived:
        value = write(hf)
        if value is not None:
            values[prefix + key] = value
    return values


def _write_metadata(writer: Any, model: nn.Module, values: Mapping[str, Any], kind: str) -> None:
    import gguf

    name = getattr(model, "name", None)
    if name:
        writer.add_name(str(name))
    writer.add_file_type(getattr(gguf.LlamaFileType, _FILE_TYPES[kind]))
    if kind.startswith("q"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in values.items():
        _add(writer, key, value)
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return
    from .vocab import add_vocab

    try:
        add_vocab(writer, tokenizer, where="the model's tokenizer")
    except CheckpointError as exc:  # the weights are written all the same, as export does
        warnings.warn(
            f"the GGUF file is written without a tokenizer: {exc}. zoo loads it (with no "
            "tokenizer); llama.cpp needs one to run it",
            RuntimeWarning,
            stacklevel=4,
        )


def _hf_value(hf: Mapping[str, Any], key: str) -> Any:
    """``config.json``'s value of ``key`` (transformers 5 keeps the rotary base under
    ``rope_parameters``)."""
    if key in hf:
        return hf[key]
    parameters = hf.get("rope_parameters")
    if isinstance(parameters, Mapping):
        return parameters.get(key)
    return None


def _add(writer: Any, key: str, value: Any) -> None:
    """``key`` with llama.cpp's type for it: bool, uint32 for counts, float32 for reals."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    else:
        raise CheckpointError(f"{key}: a value GGUF metadata does not hold here: {value!r}")


@dataclasses.dataclass(frozen=True)
class _Planned:
    """One tensor of the file: its GGUF name, how to make its data (llama.cpp's layout,
    float), its shape and its ggml type. The data is made as it is written, one tensor at a
    time, so that the whole model never exists twice."""

    name: str
    make: Callable[[], Tensor]
    shape: tuple[int, ...]
    qtype: Any


def _tensors(
    family: Family, hf: Mapping[str, Any], state: Mapping[str, Tensor], kind: str
) -> list[_Planned]:
    """Each tensor of the file, in llama.cpp's order of blocks."""
    import torch

    table = family.names(hf)
    sources: dict[str, dict[int, Tensor]] = {}  # GGUF name -> expert (-1: none) -> tensor
    for key, tensor in state.items():
        name, expert = family.gguf_name(table, key)
        sources.setdefault(name, {})[-1 if expert is None else expert] = tensor
    if family.tied_head_copy and "output.weight" not in sources:
        sources["output.weight"] = sources["token_embd.weight"]

    def source(parts: dict[int, Tensor]) -> Tensor:
        if -1 in parts:
            return parts[-1]
        return torch.stack([parts[i] for i in sorted(parts)])  # (E, out, in)

    planned = []
    for name in sorted(sources, key=_order):
        parts = sources[name]
        meta = source({i: t.to("meta") for i, t in parts.items()})
        shape = tuple(family.tensor_to_gguf(name, meta, hf).shape)

        def make(name: str = name, parts: dict[int, Tensor] = parts) -> Tensor:
            return family.tensor_to_gguf(name, source(parts), hf)

        planned.append(_Planned(name, make, shape, _type_for(name, shape, kind)))
    return planned


def _order(name: str) -> tuple[int, int, str]:
    """Token embedding first, then the blocks in order, then the rest (llama.cpp's order)."""
    block = re.match(r"blk\.(\d+)\.", name)
    if block:
        return (1, int(block[1]), name)
    return (0 if name.startswith(("token_embd", "position_embd")) else 2, 0, name)


def _type_for(name: str, shape: tuple[int, ...], kind: str) -> Any:
    """The ggml type llama.cpp's converter gives a tensor: float32 for one-dimensional ones,
    norms, biases, position tables and routers, else ``kind``, float16 where ``kind``'s blocks
    do not divide a row."""
    import gguf

    types = gguf.GGMLQuantizationType
    if len(shape) <= 1 or _ALWAYS_F32.search(name):
        return types.F32
    qtype = getattr(types, kind.upper())
    return qtype if shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else types.F16


def _typed(planned: _Planned) -> np.ndarray:
    """The tensor's bytes (or float32 values) in its ggml type."""
    import gguf
    import numpy as np
    import torch

    data = planned.make().detach().to(torch.float32).contiguous().numpy()
    if planned.qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(data)
    return gguf.quants.quantize(data, planned.qtype)


def _nbytes(planned: _Planned) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[planned.qtype]
    return math.prod(planned.shape) // block * size
