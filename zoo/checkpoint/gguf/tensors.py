"""A GGUF file's tensors as PyTorch tensors: float32, float16 and bfloat16 as they are
stored (memory-mapped, copy on write), every quantized type dequantized to float32 by the
``gguf`` package (q8_0, q4_0, q4_1, q5_0, q5_1, the k-quants q2_K to q6_K, and the rest it
decodes). The header is :mod:`zoo.checkpoint.gguf.header`'s, already checked against the file."""

from __future__ import annotations

import math
from collections.abc import Container, Iterator
from typing import TYPE_CHECKING

from .header import GGUFHeader, TensorInfo

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

__all__ = ["read_tensors", "type_name"]


def type_name(ggml_type: int) -> str:
    """``q8_0``, ``f16``, ... for a ggml type number."""
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(ggml_type).name.lower()


def read_tensors(
    header: GGUFHeader, wanted: Container[str] | None = None
) -> Iterator[tuple[TensorInfo, Tensor]]:
    """Each tensor of ``header``'s file (of those named in ``wanted``, where given), in file
    order, with its record; a tensor not wanted is not read."""
    import numpy as np

    data = np.memmap(header.path, dtype=np.uint8, mode="c")
    for info in header.tensors:
        if wanted is None or info.name in wanted:
            yield info, _tensor(data, info)


def _tensor(data: np.ndarray, info: TensorInfo) -> Tensor:
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = data[info.start : info.start + info.nbytes]
    if info.ggml_type == 0:
        return torch.from_numpy(raw.view(np.float32).reshape(info.shape))
    if info.ggml_type == 1:
        return torch.from_numpy(raw.view(np.float16).reshape(info.shape))
    if info.ggml_type == 30:
        return torch.from_numpy(raw.view(np.int16).reshape(info.shape)).view(torch.bfloat16)
    rows = raw.reshape(math.prod(info.shape[:-1]), -1)  # (rows, bytes per row)
    values = dequantize(rows, GGMLQuantizationType(info.ggml_type))  # (rows, innermost)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(info.shape))
