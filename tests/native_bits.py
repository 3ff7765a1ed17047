"""Every kernel of one built zoo kernel library, run on fixed random inputs of awkward sizes:
``python tests/native_bits.py LIBRARY`` prints one line per case, ``<case> <sha256 of its
outputs' bytes>``, so that two builds (gcc's and clang's, or two sets of flags) can be
compared bit for bit by comparing lines.

The library is opened with ctypes directly (not through :mod:`zoo.kernels.native`, which
refuses a library whose OpenMP runtime is not PyTorch's, as clang's libomp is not): this
script imports neither torch nor zoo's kernels module, only numpy and the ctypes mirrors of
the one-call step's structures (:mod:`zoo.kernels.native_abi`). Run it in a child process: a
crash in C then fails one run, not the test session. Sizes are chosen to reach every loop
tail (K not a multiple of 8, 32 or 64; rows not a multiple of 4 or of a thread's task).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from zoo.kernels import native_abi

_P, _I, _F, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int

#: The exported kernels' result and argument types (the C signatures, unchanged).
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "zoo_native_supported": (_C, []),
    "zoo_native_set_isa": (_C, [_C]),
    "zoo_gemv_f32": (None, [_P, _P, _P, _P, _I, _I, _C]),
    "zoo_gemm_f32": (None, [_P, _P, _P, _P, _I, _I, _I, _C]),
    "zoo_layer_norm_f32": (None, [_P, _P, _P, _P, _I, _F]),
    "zoo_rms_norm_f32": (None, [_P, _P, _P, _I, _F, _F]),
    "zoo_attend_rows_f32": (
        None,
        [_P, _I, _I] * 3 + [_P, _P] + [_I] * 5 + [_P] + [_I] * 4 + [_F, _P, _C],
    ),
    "zoo_gemv_int8": (_C, [_P] * 6 + [_I, _I, _C]),
    "zoo_linear_int8": (_C, [_P] * 6 + [_I, _I, _I, _C]),
    "zoo_decode_rows_f32": (_C, [_P, _I] + [_P] * 4 + [_I] + [_P] * 4 + [_I, _I, _P, _P, _C]),
}


def open_library(path: str) -> ctypes.CDLL:
    """The library at ``path`` with every kernel's types set."""
    lib = ctypes.CDLL(os.path.abspath(path))
    for name, (restype, argtypes) in SIGNATURES.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


def _f32(rng: np.random.RandomState, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _at(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def gemv_f32(lib: ctypes.CDLL) -> Iterator[tuple[str, str]]:
    for n, k in [(1, 1), (3, 7), (5, 9), (13, 31), (17, 100), (37, 257), (70, 771)]:
        for bias in (False, True):
            rng = np.random.RandomState(n * 1000 + k)
            w, x = _f32(rng, n, k), _f32(rng, k)
            b = _f32(rng, n) if bias else None
            y = np.zeros(n, np.float32)
            lib.zoo_gemv_f32(_at(w), _at(x), _at(b), _at(y), n, k, 1 + (n % 2))
            yield f"gemv_f32 n={n} k={k} bias={bias}", _digest(y)


def gemm_f32(lib: ctypes.CDLL) -> Iterator[tuple[str, str]]:
    shapes = [(2, 1, 1), (3, 7, 9), (4, 17, 100), (5, 37, 257), (7, 33, 31), (8, 70, 771)]
    for m, n, k in [*shapes, (9, 5, 33), (14, 19, 64), (16, 6, 130)]:  # 4 x 4 tiles, and rest
        for bias in (False, True):
            rng = np.random.RandomState(m * 100_000 + n * 1000 + k)
            w, x = _f32(rng, n, k), _f32(rng, m, k)
            b = _f32(rng, n) if bias else None
            y = np.zeros((m, n), np.float32)
            lib.zoo_gemm_f32(_at(w), _at(x), _at(b), _at(y), m, n, k, 1 + (n % 2))
            yield f"gemm_f32 m={m} n={n} k={k} bias={bias}", _digest(y)


def norms(lib: ctypes.CDLL) -> Iterator[tuple[str, str]]:
    for d in (1, 7, 9, 31, 100, 771, 1023):
        rng = np.random.RandomState(d)
        x, w, b = _f32(rng, d, scale=3.0), _f32(rng, d), _f32(rng, d)
        x += np.float32(0.7)  # a mean away from zero
        for has_w in (False, True):
            for has_b in (False, True):
                y = np.zeros(d, np.float32)
                lib.zoo_layer_norm_f32(
                    _at(x), _at(w) if has_w else None, _at(b) if has_b else None, _at(y), d, 1e-5
                )
                yield f"layer_norm d={d} w={has_w} b={has_b}", _digest(y)
        for offset in (0.0, 1.0):
            y = np.zeros(d, np.float32)
            lib.zoo_rms_norm_f32(_at(x), _at(w), _at(y), d, 1e-6, offset)
            yield f"rms_norm d={d} offset={offset}", _digest(y)


def attend_rows(lib: ctypes.CDLL) -> Iterator[tuple[str, str]]:
    # rows, heads, kv heads, head size, position, cache length, extra stride of q, k and v
    for rows, heads, kv, hd, pos, max_len, pad in [
        (1, 1, 1, 1, 0, 1, 0),
        (1, 4, 2, 7, 5, 9, 3),
        (2, 6, 3, 12, 13, 20, 0),
        (1, 8, 8, 64, 30, 32, 1),
        (3, 12, 4, 33, 17, 40, 5),
    ]:
        rng = np.random.RandomState(rows * 1000 + heads * 100 + hd)
        stride = hd + pad
        q, k, v = (
            _f32(rng, rows, heads, stride),
            _f32(rng, rows, kv, stride),
            _f32(rng, rows, kv, stride),
        )
        ck, cv = _f32(rng, rows, kv, max_len, hd), _f32(rng, rows, kv, max_len, hd)
        keep = (rng.random_sample((rows, max_len)) > 0.3).astype(np.uint8)
        keep[:, 0] = 1
        scale = float(np.float32(hd**-0.5))
        y = np.zeros((rows, heads, hd), np.float32)
        c_row, c_head = kv * max_len * hd, max_len * hd
        lib.zoo_attend_rows_f32(
            _at(q), heads * stride, stride, _at(k), kv * stride, stride, _at(v), kv * stride,
            stride, _at(ck), _at(cv), c_row, c_head, hd, pos, pos + 1, None, rows, heads, kv, hd,
            scale, _at(y), 2,
        )  # fmt: skip
        yield (
            f"attend_rows self rows={rows} heads={heads}/{kv} hd={hd} pos={pos}",
            _digest(y, ck, cv),
        )
        lib.zoo_attend_rows_f32(
            _at(q), heads * stride, stride, None, 0, 0, None, 0, 0, _at(ck), _at(cv), c_row,
            c_head, hd, 0, max_len, _at(keep), rows, heads, kv, hd, scale, _at(y), 2,
        )  # fmt: skip
        yield f"attend_rows memory rows={rows} heads={heads}/{kv} hd={hd}", _digest(y)


def _int8_weights(rng: np.random.RandomState, n: int, k: int) -> tuple[np.ndarray, ...]:
    """int8 rows, their scales and their sums (what zoo_gemv_int8 takes)."""
    q = rng.randint(-127, 128, size=(n, k)).astype(np.int8)
    scale = (rng.random_sample(n) * 0.02 + 1e-3).astype(np.float32)
    return q, scale, q.astype(np.int32).sum(1).astype(np.int32)


def gemv_int8(lib: ctypes.CDLL) -> Iterator[tuple[str, str]]:
    for n, k in [(1, 1), (3, 33), (7, 65), (19, 100), (33, 255), (40, 129), (70, 771)]:
        for bias in (False, True):
            for spread in (1.0, 40.0):
                rng = np.random.RandomState(n * 7 + k)
                q, scale, colsum = _int8_weights(rng, n, k)
                x = _f32(rng, k, scale=spread)
                b = _f32(rng, n) if bias else None
                y = np.zeros(n, np.float32)
                status = lib.zoo_gemv_int8(
                    _at(x), _at(q), _at(scale), _at(colsum), _at(b), _at(y), n, k, 2
                )
                yield f"gemv_int8 n={n} k={k} bias={bias} spread={spread}", f"{status} {_digest(y)}"


def linear_int8(lib: ctypes.CDLL) -> Iterator[tuple[str, str]]:
    """Many rows (a few: pairs; from 8: tiles of weight rows by input rows, and their rests)."""
    for m, n, k in [(2, 7, 65), (5, 19, 100), (8, 8, 64), (13, 33, 255), (67, 40, 771)]:
        for bias in (False, True):
            rng = np.random.RandomState(m * 31 + n * 7 + k)
            q, scale, colsum = _int8_weights(rng, n, k)
            x = _f32(rng, m, k, scale=3.0)
            b = _f32(rng, n) if bias else None
            y = np.zeros((m, n), np.float32)
            status = lib.zoo_linear_int8(
                _at(x), _at(q), _at(scale), _at(colsum), _at(b), _at(y), m, n, k, 2
            )
            yield f"linear_int8 m={m} n={n} k={k} bias={bias}", f"{status} {_digest(y)}"


class _Model:
    """A small decoder's weights and the C structures that describe it (kept alive here)."""

    def __init__(
        self, seed: int, layouts: tuple[int, ...], act: int, gated: bool, int8: bool, rot: int
    ) -> None:
        self.rng = np.random.RandomState(seed)
        self.keep: list[object] = []
        self.d, self.heads, self.kv, self.hd, self.ffn, self.vocab = 20, 4, 2, 6, 37, 11
        blocks = (native_abi.Block * len(layouts))()
        for i, layout in enumerate(layouts):
            blocks[i] = self.block(layout, act, gated, int8 and i % 2 == 0)
        self.blocks = blocks
        self.embedding = self.embed(int8, learned=rot == 0)
        self.decoder = native_abi.Decoder(
            embedding=self.embedding,
            blocks=ctypes.addressof(blocks),
            n_blocks=len(layouts),
            has_final=1,
            final_norm=self.norm(rms=act == 3),
            head=self.linear(self.vocab, self.d, bias=False, int8=False),
        )

    def array(self, a: np.ndarray) -> int:
        self.keep.append(a)
        return a.ctypes.data

    def linear(self, n: int, k: int, bias: bool, int8: bool) -> native_abi.Linear:
        if int8:
            q, scale, colsum = _int8_weights(self.rng, n, k)
            b = self.array(_f32(self.rng, n)) if bias else None
            return native_abi.Linear(
                kind=1, n=n, k=k, w=self.array(q), scale=self.array(scale),
                colsum=self.array(colsum), bias=b,
            )  # fmt: skip
        w = _f32(self.rng, n, k, scale=k**-0.5)
        b = self.array(_f32(self.rng, n, scale=0.1)) if bias else None
        return native_abi.Linear(kind=0, n=n, k=k, w=self.array(w), bias=b)

    def norm(self, rms: bool) -> native_abi.Norm:
        w = self.array(_f32(self.rng, self.d, scale=0.2) + np.float32(1.0))
        if rms:
            return native_abi.Norm(kind=1, w=w, eps=1e-6, offset=0.0)
        return native_abi.Norm(kind=0, w=w, b=self.array(_f32(self.rng, self.d)), eps=1e-5)

    def block(self, layout: int, act: int, gated: bool, int8: bool) -> native_abi.Block:
        width = (self.heads + 2 * self.kv) * self.hd
        return native_abi.Block(
            layout=layout, d_model=self.d, heads=self.heads, kv_heads=self.kv,
            head_dim=self.hd, act=act, gated=int(gated), scale=self.hd**-0.5,
            norm1=self.norm(rms=act == 3), norm2=self.norm(rms=act == 3),
            qkv=self.linear(width, self.d, bias=True, int8=int8),
            out=self.linear(self.d, self.heads * self.hd, bias=True, int8=int8),
            fc=self.linear(self.ffn * (2 if gated else 1), self.d, bias=act != 3, int8=int8),
            proj=self.linear(self.d, self.ffn, bias=act != 3, int8=int8),
        )  # fmt: skip

    def embed(self, int8: bool, learned: bool) -> native_abi.Embedding:
        positions = self.array(_f32(self.rng, 16, self.d)) if learned else None
        if int8:
            rows = self.rng.randint(-127, 128, size=(self.vocab, self.d)).astype(np.int8)
            row_scale = self.array((self.rng.random_sample(self.vocab) * 0.05).astype(np.float32))
            return native_abi.Embedding(
                kind=1, vocab=self.vocab, max_positions=16, rows=self.array(rows),
                row_scale=row_scale, positions=positions, scale=float(np.float32(self.d**0.5)),
            )  # fmt: skip
        rows = _f32(self.rng, self.vocab, self.d)
        return native_abi.Embedding(
            kind=0, vocab=self.vocab, max_positions=16, rows=self.array(rows),
            positions=positions, scale=1.0,
        )  # fmt: skip


def decode_step(lib: ctypes.CDLL) -> Iterator[tuple[str, str]]:
    """Six steps of small decoders of every block layout, activation, gating, rotary width
    and weight kind, their logits and key/value caches after each: one sequence; three in
    slots 2, 0 and 1 of four, each at its own position; one in slot 1 beside two tokens of a
    prompt in slot 0 (the logits of the first and the last row)."""
    steps, max_len = 6, 8
    configs = [
        ((0, 0), 0, False, False, 0),  # pre-norm, GELU (erf), learned positions (no rotary)
        ((0, 0), 1, False, True, 0),  # GELU tanh, int8 products
        ((1, 1), 2, False, False, 4),  # post-norm, ReLU, rotary over 4 of 6 features
        ((2, 2), 1, False, False, 6),  # parallel residual, full rotary
        ((0, 0, 0), 3, True, False, 6),  # SiLU, gated (Llama-like)
        ((0, 0), 3, True, True, 2),  # the same in int8, a narrow rotary
    ]
    placements = ([0], [2, 0, 1], [1, 0, 0])
    for (number, config), slots in itertools.product(enumerate(configs), placements):
        layouts, act, gated, int8, rot = config
        model = _Model(number, layouts, act, gated, int8, rot)
        shape = (max(slots) + 1, model.kv, max_len, model.hd)
        caches = [np.zeros(shape, np.float32) for _ in range(2 * len(layouts))]
        ck = (ctypes.c_void_p * len(layouts))(*[c.ctypes.data for c in caches[: len(layouts)]])
        cv = (ctypes.c_void_p * len(layouts))(*[c.ctypes.data for c in caches[len(layouts) :]])
        rows, outs, places = len(slots), [], np.array(slots, np.int64)
        prompt = slots == [1, 0, 0]
        wanted = np.array([0, 2] if prompt else range(rows), np.int64)
        for step in range(steps):
            if prompt:  # the prompt's two tokens at successive positions
                pos = np.array([step, step % 4 * 2, step % 4 * 2 + 1], np.int64)
            else:
                pos = np.array([max(step - r, 0) for r in range(rows)], np.int64)  # rows lag
            tokens = (step * 5 + number + np.arange(rows, dtype=np.int64)) % model.vocab
            angles = np.arange(max(rot, 1), dtype=np.float64) * (pos[:, None] + 1) / 3.0
            cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
            logits = np.zeros((len(wanted), model.vocab), np.float32)
            status = lib.zoo_decode_rows_f32(
                ctypes.addressof(model.decoder), rows, _at(tokens), _at(pos), _at(places), _at(pos),
                len(wanted), _at(wanted), _at(logits), ck, cv, max_len, rot, _at(cos), _at(sin), 2,
            )  # fmt: skip
            assert status == 0, f"decode step {number} at {step} returned {status}"
            outs.append(logits)
        name = f"decode_step layouts={layouts} act={act} gated={gated} int8={int8} rot={rot}"
        yield f"{name} slots={slots}", _digest(*outs, *caches)


CASES: list[Callable[[ctypes.CDLL], Iterator[tuple[str, str]]]] = [
    gemv_f32,
    gemm_f32,
    norms,
    attend_rows,
    gemv_int8,
    linear_int8,
    decode_step,
]


def main(path: str) -> None:
    lib = open_library(path)
    if not lib.zoo_native_supported():
        print("unsupported")  # a CPU without AVX2 and FMA: the kernels must not be called
        return
    isa = os.environ.get("ZOO_NATIVE_ISA")  # the kernels' variant, forced (default: widest)
    if isa and lib.zoo_native_set_isa(("avx2", "avx512").index(isa)) != 0:
        print("unsupported")  # a CPU without that instruction set
        return
    for cases in CASES:
        for name, digest in cases(lib):
            print(f"{name}: {digest}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
