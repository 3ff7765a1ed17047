"""A GGUF file is as untrusted as any download: every count, length, shape and offset in its
header is checked against the file before anything of that size is built, and whatever is
wrong is a :class:`~zoo.errors.CorruptCheckpointError` naming it. Each attack here is a file
built byte by byte."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from zoo.checkpoint.gguf.header import read_header
from zoo.errors import CheckpointError, CorruptCheckpointError

pytest.importorskip("gguf")

U32, U64, F32, STRING, ARRAY = 4, 10, 6, 8, 9


def _str(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", kind) + payload


def _tensor(name: str, dims: list[int], kind: int = 0, offset: int = 0) -> bytes:
    packed = b"".join(struct.pack("<Q", d) for d in dims)
    return _str(name) + struct.pack("<I", len(dims)) + packed + struct.pack("<IQ", kind, offset)


def _file(
    kvs: list[bytes],
    tensors: list[bytes],
    data: bytes = b"",
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kvs: int | None = None,
) -> bytes:
    head = b"GGUF" + struct.pack("<I", version)
    head += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors,
                        len(kvs) if n_kvs is None else n_kvs)  # fmt: skip
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


ARCH = _kv("general.architecture", STRING, _str("llama"))
ONE = _tensor("token_embd.weight", [4, 2])  # (2, 4) float32: 32 bytes
VALID = _file([ARCH], [ONE], bytes(32))


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    return path


def test_a_valid_file_reads(tmp_path: Path) -> None:
    header = read_header(_write(tmp_path, VALID))
    assert header.architecture == "llama" and header.tensors[0].shape == (2, 4)


ATTACKS = {
    "tensor count beyond the file": (
        _file([ARCH], [ONE], bytes(32), n_tensors=1 << 62), "the tensor count is"),
    "metadata count beyond the file": (
        _file([ARCH], [ONE], bytes(32), n_kvs=1 << 40), "the metadata count is"),
    "a string longer than the file": (
        _file([_kv("general.architecture", STRING, _str("llama", length=1 << 50))], []),
        "the length of 'general.architecture'"),
    "an array longer than the file": (
        _file([_kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 1 << 40))], []),
        "the length of 'tokenizer.ggml.tokens'"),
    "an array of arrays": (
        _file([_kv("x", ARRAY, struct.pack("<IQ", ARRAY, 1) + struct.pack("<IQ", U32, 0))], []),
        "an array of arrays"),
    "an unknown value type": (_file([_kv("x", 99, b"")], []), "unknown value type 99"),
    "a key that is not UTF-8": (
        _file([_str(b"\xff\xfe") + struct.pack("<I", U32) + bytes(4)], []), "is not UTF-8"),
    "a key twice": (_file([ARCH, ARCH], []), "appears twice"),
    "five dimensions": (_file([ARCH], [_tensor("t", [1, 1, 1, 1, 1])]), "has 5 dimensions"),
    "no dimensions": (_file([ARCH], [_tensor("t", [])]), "has 0 dimensions"),
    "a zero dimension": (_file([ARCH], [_tensor("t", [4, 0])]), "at least 1"),
    "a shape whose bytes overflow": (
        _file([ARCH], [_tensor("t", [1 << 40, 1 << 40, 1 << 40])]), "runs past the end"),
    "an offset past the end": (
        _file([ARCH], [_tensor("t", [8], offset=1 << 20)], bytes(32)), "runs past the end"),
    "a misaligned offset": (_file([ARCH], [_tensor("t", [1], offset=4)], bytes(64)), "misaligned"),
    "an unknown ggml type": (_file([ARCH], [_tensor("t", [8], kind=77)], bytes(32)),
                             "unknown ggml type 77"),
    "a row its blocks do not divide": (
        _file([ARCH], [_tensor("t", [33], kind=8)], bytes(64)), "a multiple of 32"),
    "a tensor twice": (_file([ARCH], [ONE, ONE], bytes(32)), "appears twice"),
    "an alignment that is no power of two": (
        _file([ARCH, _kv("general.alignment", U32, struct.pack("<I", 24))], [ONE], bytes(64)),
        "not a power of two"),
    "a big-endian file": (
        b"GGUF" + struct.pack(">I", 3) + struct.pack(">QQ", 0, 0), "big-endian"),
    "version 1": (_file([ARCH], [], version=1), "GGUF version 1"),
    "a tensor name longer than any": (_file([ARCH], [_tensor("t" * 300, [1])]), "tensor 0"),
}  # fmt: skip


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_attack_is_a_clear_error_before_anything_is_built(tmp_path: Path, attack: str) -> None:
    data, says = ATTACKS[attack]
    path = _write(tmp_path, data)
    started = time.perf_counter()
    with pytest.raises(CorruptCheckpointError, match=rf"{path}.*{_escape(says)}") as caught:
        read_header(path)
    assert time.perf_counter() - started < 1.0  # refused from the numbers, nothing read or built
    assert caught.value.path == path


def _escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize("cut", [5, 12, 30, 60, len(VALID) - 40, len(VALID) - 1])
def test_a_truncated_file_is_a_clear_error(tmp_path: Path, cut: int) -> None:
    path = _write(tmp_path, VALID[:cut])
    with pytest.raises(CorruptCheckpointError, match=r"truncated|runs past the end|bytes"):
        read_header(path)


def test_zoo_load_of_a_hostile_file_says_what_is_wrong(tmp_path: Path) -> None:
    import zoo

    path = _write(tmp_path, ATTACKS["tensor count beyond the file"][0])
    with pytest.raises(CheckpointError, match="tensor count"):
        zoo.load(path)


FUZZ = """
import random, sys
from pathlib import Path
from zoo.errors import CorruptCheckpointError, CheckpointError
from zoo.checkpoint.gguf.header import read_header
from zoo.checkpoint.gguf.tensors import read_tensors
seed, source, target = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
good = bytearray(source.read_bytes())
rng = random.Random(seed)
for trial in range(150):
    data = bytearray(good)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(data))
        data[i] = rng.randrange(256) if rng.random() < 0.7 else 0xFF
    if rng.random() < 0.2:
        del data[rng.randrange(len(data)):]
    target.write_bytes(bytes(data))
    try:
        header = read_header(target)
        for _ in read_tensors(header):
            pass
    except CorruptCheckpointError:
        pass
print("survived")
"""


def test_random_damage_is_an_error_or_a_file_never_a_crash(tmp_path: Path) -> None:
    """Bytes of a real file (a q8_0 and a float32 tensor, a vocabulary) changed at random:
    each read either succeeds or raises CorruptCheckpointError, in a child process so that a
    crash fails this test rather than the run."""
    import gguf
    import numpy as np

    source = tmp_path / "good.gguf"
    writer = gguf.GGUFWriter(str(source), "llama")
    writer.add_token_list(["a", "b", "c"])
    writer.add_token_scores([0.0, -1.0, -2.0])
    weights = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    writer.add_tensor("x.weight", weights)
    q8 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("y.weight", gguf.quants.quantize(weights, q8), raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for seed in range(3):
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(FUZZ), str(seed), str(source),
             str(tmp_path / "bad.gguf")],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0 and "survived" in run.stdout, run.stderr[-2000:]
