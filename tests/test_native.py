"""zoo's own float32 kernel for one row and a few (:mod:`zoo.kernels.native`,
``zoo/kernels/_native.c``): its product against float64 and ``F.linear`` over shapes that
exercise every loop tail, the same bits on one thread and two and for a row alone or beside
others, the inputs it must leave to PyTorch, :func:`zoo.kernels.onednn.cpu_linear` using it
for a few rows only, ``ZOO_NATIVE_KERNELS=0``, and a model decoding the same greedy tokens
with it and without it, through it at every step.

Every call into the kernel runs in a child process (forked from one that imported torch and
zoo, :mod:`forkserver`): a crash in C is a failed case, not a dead test run. The cases skip
only where the kernel is not built or cannot run (no C compiler with OpenMP at install time,
a CPU without AVX2 and FMA); :func:`test_the_kernel_is_built_where_it_can_be` fails where it
could have been and is not, so a broken build never hides behind those skips.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from forkserver import ForkServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zoo.settings import Settings

ROOT = Path(__file__).parents[1]

#: The set-up of every child: the helpers the cases call (run in the fork server once).
SETUP = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.nn.functional as F
    import zoo
    from zoo.kernels import native
    from zoo.kernels import onednn
    from zoo.runtime import native_block

    def tensors(lead, n, k, bias, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(*lead, k, generator=g)
        w = torch.randn(n, k, generator=g)
        b = torch.randn(n, generator=g) if bias else None
        return x, w, b

    def check_linear(lead, n, k, bias, seed):
        # the kernel against the exact product (float64), F.linear, and itself on 1 and 2 threads
        x, w, b = tensors(lead, n, k, bias, seed)
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = native.linear(x, w, b)
            assert y is not None, "the kernel refused one float32 row"
            assert y.shape == (*lead, n) and y.dtype is torch.float32, y.shape
            outs.append(y)
        assert torch.equal(outs[0], outs[1]), "1 and 2 threads gave different bits"
        row, wd = x.double().reshape(1, k), w.double()
        exact = row @ wd.T + (0 if b is None else b.double())  # (1, N)
        # any summation order of K products and a bias is within gamma_(K+1) of the sum of
        # their magnitudes (Higham, Accuracy and Stability, 3.1); 2**-24: float32's unit
        scale = row.abs() @ wd.abs().T + (0 if b is None else b.double().abs())
        bound = (k + 1) * 2.0**-24 / (1 - (k + 1) * 2.0**-24) * scale
        got = outs[0].double().reshape(1, n)
        assert bool(((got - exact).abs() <= bound).all()), float((got - exact).abs().max())
        ref = F.linear(x, w, b).double().reshape(1, n)
        assert bool(((got - ref).abs() <= 2 * bound).all()), "far from F.linear"

    def check_rows(m, n, k, bias, seed):
        # a few rows at once: each row the bits it has alone, on 1 and 2 threads alike, and
        # within the summation bound of the exact product
        x, w, b = tensors((m,), n, k, bias, seed)
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = native.linear(x, w, b)
            assert y is not None and y.shape == (m, n), "the kernel refused a few rows"
            outs.append(y)
        assert torch.equal(outs[0], outs[1]), "1 and 2 threads gave different bits"
        alone = torch.cat([native.linear(x[i : i + 1], w, b) for i in range(m)])
        assert torch.equal(outs[0], alone), "a row's bits depend on the rows beside it"
        exact = x.double() @ w.double().T + (0 if b is None else b.double())
        scale = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
        bound = (k + 1) * 2.0**-24 / (1 - (k + 1) * 2.0**-24) * scale
        assert bool(((outs[0].double() - exact).abs() <= bound).all())
    """
)


@pytest.fixture(scope="module")
def children() -> Iterator[ForkServer]:
    """One interpreter that has imported torch and zoo; each case runs in a child forked from
    it (a process of its own, started in milliseconds)."""
    server = ForkServer(SETUP)
    yield server
    server.close()


def run(server: ForkServer, code: str) -> tuple[int, str]:
    """``code`` in a child of ``server``: its exit code (``-N`` for signal N) and what it wrote
    on stdout and stderr."""
    fd, name = tempfile.mkstemp(prefix="zoo-native-", suffix=".log")
    os.close(fd)
    prologue = (
        f"_log = os.open({name!r}, os.O_WRONLY | os.O_TRUNC)\nos.dup2(_log, 1)\nos.dup2(_log, 2)\n"
    )
    # os._exit: a forked child of torch takes seconds to finalise the interpreter at exit
    epilogue = "\nsys.stdout.flush()\nsys.stderr.flush()\nos._exit(0)\n"
    child = server.start(prologue + textwrap.dedent(code) + epilogue)
    try:
        returncode = child.wait(timeout=120)
    finally:
        child.kill()
    text = Path(name).read_text()
    os.unlink(name)
    return returncode, text


def passes(server: ForkServer, code: str) -> str:
    """Runs ``code`` in a child and fails the test unless it exits 0; returns its output."""
    returncode, text = run(server, code)
    assert returncode == 0, f"child exited {returncode}:\n{text}"
    return text


@pytest.fixture(scope="module")
def kernel(children: ForkServer) -> ForkServer:
    """The fork server, for cases that need the kernel: they skip where it is not built or the
    CPU cannot run it (see the module's docstring)."""
    if not _kernel_available(children):
        pytest.skip("needs zoo's native kernels (zoo.kernels._native not built, or no AVX2+FMA)")
    return children


@functools.cache
def _kernel_available(server: ForkServer) -> bool:
    return run(server, "sys.exit(0 if native.available() else 3)")[0] == 0


def _can_build() -> bool:
    """Whether ``pip install`` here builds the kernel and it can run: an x86-64 CPU with AVX2
    and FMA, Python's C compiler on the path, Python's headers."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    return {"avx2", "fma"} <= set(flags) and bool(shutil.which(compiler)) and headers.exists()


def test_the_kernel_is_built_where_it_can_be(children):
    """A machine with a C compiler and AVX2+FMA (CI's) has the kernel: its build or its load
    failing there is a failure, not a skip of the cases below."""
    if not Settings.from_env().native_kernels:
        pytest.skip("needs zoo's native kernels: turned off (ZOO_NATIVE_KERNELS=0)")
    if not _can_build():
        pytest.skip("needs zoo's native kernels: no C compiler or no AVX2+FMA here")
    assert _kernel_available(children), (
        "a C compiler and AVX2+FMA are here but zoo.kernels.native.available() is False: "
        "rebuild with `pip install -e .` and read build_ext's warning"
    )


def test_a_library_without_the_kernels_functions_leaves_pytorchs_kernels(children):
    """A loadable extension that lacks the kernels' functions (here the standard library's
    ``_ctypes``, standing for a build of an older ``_native.c``) is no kernel: ``available()``
    is False and the caller computes with PyTorch's kernels."""
    passes(
        children,
        """
        os.environ["ZOO_NATIVE_KERNELS"] = "1"
        from zoo.kernels import native_load
        native_load._SOURCE = "_ctypes"
        native._library.cache_clear()
        assert native.available() is False
        x, w, b = tensors((1,), 4, 8, True, 0)
        assert native.linear(x, w, b) is None
        """,
    )


# shapes: N and K on both sides of the kernel's blocks (4 rows, 16-row tasks, 8 lanes)
_N = st.one_of(st.integers(1, 40), st.integers(41, 300))
_K = st.one_of(st.integers(1, 20), st.integers(21, 400))
_LEAD = st.sampled_from([(1,), (1, 1), ()])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lead=_LEAD, n=_N, k=_K, bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_one_row_matches_float64_and_f_linear(kernel, lead, n, k, bias, seed):
    passes(kernel, f"check_linear({lead!r}, {n}, {k}, {bias}, {seed})")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(2, 8), n=_N, k=_K, bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_a_few_rows_give_each_rows_own_bits(kernel, m, n, k, bias, seed):
    """Up to ``FEW_ROWS`` rows (a beam search's beams, a few sequences) in one pass over the
    weights: row by row the bits of that row alone, whatever the rows beside it."""
    passes(kernel, f"check_rows({m}, {n}, {k}, {bias}, {seed})")


@pytest.mark.parametrize(
    ("n", "k"),
    [(1, 1), (3, 7), (4, 8), (5, 9), (16, 16), (17, 33), (2304, 768), (768, 3072)],
)
def test_edge_and_model_shapes(kernel, n, k):
    """Below one block of each loop, exactly one, one past, and gpt2-124m's own shapes."""
    passes(kernel, f"check_linear((1,), {n}, {k}, True, 7)")
    passes(kernel, f"check_linear((1, 1), {n}, {k}, False, 8)")


def test_empty_shapes_and_views_into_larger_tensors(kernel):
    """No outputs, or no inputs (the bias alone), as ``F.linear``; and tensors that are views
    at an offset into larger ones (unaligned, contiguous) are read from where they start."""
    passes(
        kernel,
        """
        for n, k in [(0, 5), (5, 0), (0, 0)]:
            for bias in (True, False):
                x, w, b = tensors((1,), n, k, bias, 1)
                y = native.linear(x, w, b)
                assert y is not None and torch.equal(y, F.linear(x, w, b)), (n, k, bias)
        x = torch.randn(3, 41)[1:2, 1:]  # (1, 40) at an offset of 42 floats
        w = torch.randn(30 * 40 + 1)[1:].view(30, 40)
        b = torch.randn(31)[1:]
        assert x.is_contiguous() and w.is_contiguous()
        y = native.linear(x, w, b)
        exact = x.double() @ w.double().T + b.double()
        assert y is not None and torch.allclose(y.double(), exact, rtol=1e-5, atol=1e-5)
        """,
    )


def test_inputs_it_leaves_to_pytorch(kernel):
    """``None`` (the caller computes it) for anything but one to ``FEW_ROWS`` contiguous
    float32 rows against a contiguous 2-d float32 weight and a matching float32 bias."""
    passes(
        kernel,
        """
        from zoo.kernels.ops import FEW_ROWS

        x, w, b = tensors((1,), 24, 40, True, 3)
        assert native.linear(x, w, b) is not None
        assert native.linear(torch.randn(2, 1, 40), w, b) is not None
        cases = {
            "too many rows": (torch.randn(FEW_ROWS + 1, 40), w, b),
            "too many rows, 3-d": (torch.randn(1, FEW_ROWS + 1, 40), w, b),
            "float64": (x.double(), w.double(), b.double()),
            "float64 x": (x.double(), w, b),
            "bfloat16": (x.bfloat16(), w.bfloat16(), b.bfloat16()),
            "bfloat16 weight": (x, w.bfloat16(), b),
            "float64 bias": (x, w, b.double()),
            "non-contiguous x": (torch.randn(1, 80)[:, ::2], w, b),
            "non-contiguous w": (x, torch.randn(40, 24).T, b),
            "non-contiguous bias": (x, w, torch.randn(48)[::2]),
            "bias too long": (x, w, torch.randn(25)),
            "bias too short": (x, w, torch.randn(23)),
            "3-d weight": (x, w.reshape(1, 24, 40), b),
            "K mismatch": (torch.randn(1, 39), w, b),
            "meta": (x.to("meta"), w.to("meta"), b.to("meta")),
        }
        for name, (xx, ww, bb) in cases.items():
            assert native.linear(xx, ww, bb) is None, name
        """,
    )


def test_cpu_linear_uses_it_for_a_few_rows_only(kernel):
    """:func:`cpu_linear` gives the kernel's bits for one to ``FEW_ROWS`` rows of a large
    float32 weight, and oneDNN's for more (the kernel declines them)."""
    passes(
        kernel,
        """
        n, k = 512, onednn.MIN_WEIGHTS // 512  # just large enough for cpu_linear's fast path
        x, w, b = tensors((1, 1), n, k, True, 5)
        results = []
        real = native.linear

        def spy(*args):
            results.append(real(*args))
            return results[-1]

        native.linear = spy
        with torch.no_grad():
            one = onednn.cpu_linear(x, w, b)
            assert len(results) == 1 and results[0] is not None
            assert torch.equal(one, results[0])
            from zoo.kernels.ops import FEW_ROWS

            few = onednn.cpu_linear(torch.randn(FEW_ROWS, k), w, b)
            assert len(results) == 2 and torch.equal(few, results[1])
            rows = torch.randn(FEW_ROWS + 1, k)
            several = onednn.cpu_linear(rows, w, b)
            assert len(results) == 3 and results[2] is None
            assert torch.equal(several, onednn._kernel()(rows, w, b, "none", [], ""))
        """,
    )


#: A decoder with gpt2-124m's layer shapes (so each linear is as large as the real model's
#: and takes cpu_linear's fast path), one layer deep, and a vocabulary of 768: its output
#: layer (tied to the embedding) is as small as the real model's smallest, 768 x 768.
MODEL = dict(n_layers=1, vocab_size=768, context_length=64)

#: Greedy decoding: its new tokens and its last logits as JSON, and how many single-row
#: products went through the kernel (or declined it) during the decoding.
DECODE = """
native_rows, declined = [], []
real = native.linear

def spy(x, w, b=None):
    y = real(x, w, b)
    if x.numel() == x.shape[-1]:  # one row: what batch-1 decoding computes
        (native_rows if y is not None else declined).append(tuple(w.shape))
    return y

native.linear = spy
one_call, real_decode = [], native_block.decode

def decode_spy(*args):
    y = real_decode(*args)
    one_call.append(y is not None)
    return y

native_block.decode = decode_spy
torch.manual_seed(0)
model = zoo.build("gpt2-124m", **{model}).eval()
ids = torch.tensor([[5, 17, 3, 99, 250, 7]])
with torch.no_grad():
    out = zoo.generate(model, ids, max_new_tokens={tokens}, temperature=0)
    logits = model(out)[0, -1]
json.dump(dict(
    tokens=out[0, ids.shape[1]:].tolist(),
    logits=logits.tolist(),
    weights=float(sum(p.double().sum() for p in model.parameters())),
    available=native.available(),
    native=len(native_rows),
    one_call=one_call.count(True),
    declined=declined,
    linears=sum(p.dim() == 2 and p.numel() >= 768 * 768 for p in model.parameters()),
), sys.stdout)
"""

TOKENS = 12


def _decode_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


#: Turned off: the kernel is not available and declines every call, and ``cpu_linear`` on one
#: row computes what oneDNN does.
TURNED_OFF = """
x, w, b = tensors((1,), 512, onednn.MIN_WEIGHTS // 512, True, 9)
assert native.linear(x, w, b) is None and not native.available()
with torch.no_grad():
    y = onednn.cpu_linear(x, w, b)
assert torch.allclose(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
if onednn.available():
    assert torch.equal(y, onednn._kernel()(x, w, b, "none", [], ""))
"""


@pytest.fixture(scope="module")
def decoded_without_kernel() -> dict:
    """``ZOO_NATIVE_KERNELS=0`` in a fresh process: :data:`TURNED_OFF`'s checks, then the
    decoding on PyTorch's kernels."""
    env = {**os.environ, "ZOO_NATIVE_KERNELS": "0"}
    code = SETUP + TURNED_OFF + DECODE.format(model=MODEL, tokens=TOKENS)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return _decode_json(done.stdout)


@pytest.fixture(scope="module")
def decoded_with_kernel(kernel: ForkServer) -> dict:
    return _decode_json(passes(kernel, DECODE.format(model=MODEL, tokens=TOKENS)))


def test_zoo_native_kernels_0_keeps_pytorch_kernels(decoded_without_kernel):
    """Turned off (a fresh process), the kernel is not available, never runs, and
    ``cpu_linear`` gives oneDNN's and ``F.linear``'s result (:data:`TURNED_OFF`)."""
    assert decoded_without_kernel["available"] is False
    assert decoded_without_kernel["native"] == 0


def test_greedy_tokens_are_the_same_with_and_without_the_kernel(
    decoded_with_kernel, decoded_without_kernel
):
    with_kernel, without = decoded_with_kernel, decoded_without_kernel
    assert with_kernel["weights"] == without["weights"]  # the same model
    assert with_kernel["tokens"] == without["tokens"]
    diff = max(abs(a - b) for a, b in zip(with_kernel["logits"], without["logits"], strict=True))
    assert diff < 1e-4, diff


def test_batch_1_decoding_runs_on_the_kernel(decoded_with_kernel):
    """The regression guard: a float32 model with gpt2-124m's layers, built and decoded as a
    user would, computes every single-row product of its large weights on the kernel at every
    step (a silent fallback to PyTorch's kernels fails here)."""
    result = decoded_with_kernel
    assert result["available"] is True
    assert result["declined"] == []
    # each step after the prompt's runs each of its 5 weights (q/k/v, attention output, the
    # two of the MLP, the output layer) once on one row, all in the one call of
    # zoo.runtime.native_block.decode (a silent fallback to the per-module path fails here)
    assert result["linears"] == 5
    assert result["one_call"] >= TOKENS - 1, result
