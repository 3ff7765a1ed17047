"""What zoo's C kernels are handed (:mod:`zoo.kernels.native`, :mod:`zoo.kernels.native_int8`, the
one-call step of :mod:`zoo.runtime.native_block` and :mod:`zoo.runtime.native_plan`): only plain CPU
tensors whose elements lie inside their storage, in the layout the kernel reads, and only a
library whose C structures are the ones the ctypes mirrors describe.

- A weight changed in place between decoded tokens (``t_()``, ``as_strided_``, ``p.data``
  cut or viewed as another dtype) is read again at the next step: the one call gives the
  per-module path's logits, or declines where PyTorch raises.
- A tensor subclass (``TwoTensor``, built as DTensor and torchao's tensors are: float32, CPU,
  contiguous, address 0) is never handed to C: ``zoo.generate`` decodes with PyTorch's
  kernels to PyTorch's tokens instead of a segmentation fault, and each per-module kernel
  declines it; so does a tensor whose storage was freed or shrunk under it.
- A built library whose ABI (``zoo_abi``: a version and each structure's size and offsets)
  differs from the mirrors, or that has no ``zoo_abi`` (a stale build), is refused with a
  warning that says to rebuild, and PyTorch's kernels run.

Each case runs in a child process forked from one that imported torch and zoo
(:mod:`forkserver`), so a crash in C fails the test instead of killing the run, and a case
starts in milliseconds; the cases skip where the kernels do not run (not built, or a CPU
without AVX2 and FMA).
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from collections.abc import Iterator

import pytest
from forkserver import ForkServer
from native_child import PREAMBLE


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    """One interpreter that has imported torch and zoo (not opened the kernels: each child
    opens them, as a process does), with zoo's kernels allowed."""
    env = {k: v for k, v in os.environ.items() if k != "ZOO_NATIVE_KERNELS"}
    forks = ForkServer("import os, sys\nimport torch\nimport zoo\n", env=env)
    yield forks
    forks.close()


def run_native(server: ForkServer, code: str, timeout: float = 120) -> list[str]:
    """``code`` (after :data:`native_child.PREAMBLE`) in a child of ``server``: the lines it
    printed that start with ``ok``; the test fails on any exit but 0 (a crash: -11) and is
    skipped where the kernels do not run."""
    fd, name = tempfile.mkstemp(prefix="zoo-native-trust-", suffix=".log")
    os.close(fd)
    prologue = f"_log = os.open({name!r}, os.O_WRONLY | os.O_TRUNC)\nos.dup2(_log, 1)\n"
    prologue += "os.dup2(_log, 2)\n"
    epilogue = "\nsys.stdout.flush()\nsys.stderr.flush()\nos._exit(0)\n"
    child = server.start(prologue + PREAMBLE + code + epilogue)
    try:
        returncode = child.wait(timeout=timeout)
    finally:
        child.kill()
        with open(name, encoding="utf-8", errors="replace") as log:
            text = log.read()
        os.unlink(name)
    assert returncode == 0, f"child exited {returncode}:\n{text[-4000:]}"
    if text.split() == ["unavailable"]:
        pytest.skip("needs zoo's native kernels: not built, or a CPU without AVX2 and FMA")
    return [line for line in text.splitlines() if line.startswith("ok")]


COMMON = textwrap.dedent(
    """
    import itertools
    import torch
    import zoo
    from zoo.kernels import native_facts
    from zoo.runtime import native_block
    from zoo.runtime.cache import KVCache

    def session_logits(model, ids, keep, positions, cache):
        # what a decoding session computes for new ids: the one-call step where it applies
        # (zoo.runtime.native_block.one_call), else the model's forward pass
        fused = native_block.one_call(model, ids, keep, positions, cache)
        if fused is not None:
            return fused
        return model.logits(ids, keep, positions, cache=cache)

    fused_decode = native_block.decode
    calls = []

    def counted(*args):
        out = fused_decode(*args)
        calls.append(out is not None)
        return out

    def tiny(seed=2):
        torch.manual_seed(seed)
        sizes = dict(n_layers=2, d_model=32, n_heads=4, d_ff=32, vocab_size=97, dropout=0.0)
        model = zoo.build("gpt2-124m", **sizes).eval()
        with torch.no_grad():  # weights large enough that a wrong layout shows
            for p in model.parameters():
                p.add_(torch.randn(p.shape) * 0.3)
        return model

    def decode(model, change, fused=True):
        '''Prefill five tokens, decode one, apply ``change``, decode three more: the logits of
        the steps after the change, or the exception raised.'''
        c = model.config
        cache = KVCache(c.n_layers, 1, c.n_heads, 16, c.head_size, dtype=torch.float32,
                        device=torch.device("cpu"))
        native_block.decode = counted if fused else (lambda *args: None)
        out = []
        try:
            with torch.inference_mode():
                session_logits(model, torch.tensor([[3, 1, 4, 1, 5]]), None, torch.arange(5)[None],
                             cache=cache)
                for i, token in enumerate([9, 2, 6, 5]):
                    if i == 1:
                        change(model)
                    pos = torch.tensor([[cache.length]])
                    logits = session_logits(model, torch.tensor([[token]]), None, pos, cache=cache)
                    if i >= 1:
                        out.append(logits)
        except RuntimeError as error:
            return error
        finally:
            native_block.decode = fused_decode
        return torch.cat(out, 1)
    """
)

LAYOUTS = COMMON + textwrap.dedent(
    """
    def transposed(model):
        model.blocks[0].ffn.fc.weight.t_()

    def strided(model):
        w = model.blocks[1].attn.proj.weight
        w.as_strided_(w.shape, (1, w.shape[0]))

    def norm_strided(model):  # a vector read every other element
        w = model.blocks[0].attn_norm.weight
        w.data = torch.randn(2 * w.numel())[::2]

    def shifted(model):  # same storage, another offset: the next rows
        w = model.blocks[1].ffn.proj.weight
        w.data = torch.cat([w.detach(), torch.randn_like(w)])[3:3 + w.shape[0]]

    # a layout the one call does not read (not contiguous) declines; another address is read;
    # with PyTorch's C++ check of the tensors and with the passes in Python alike
    cases = ((transposed, False), (strided, False), (norm_strided, False), (shifted, True))
    for guards, (change, fused) in itertools.product((native_facts.TensorGuards, None), cases):
        native_facts.TensorGuards = guards
        calls.clear()
        fast = decode(tiny(), change)
        slow = decode(tiny(), change, fused=False)
        assert torch.equal(fast.argmax(-1), slow.argmax(-1)), change.__name__
        diff = (fast - slow).abs().max().item()
        assert diff < 1e-4, (change.__name__, diff)
        assert calls == [True] + [fused] * 3, (change.__name__, calls)
        print("ok", change.__name__, f"{diff:.2e}")
    """
)


def test_a_weights_layout_changed_in_place_between_steps_is_read_again(server):
    """``t_()`` or ``as_strided_`` on a square weight keep its address and its shape: the one
    call read the old layout (logits 3.45 off, other greedy tokens) until the plan checked
    strides as well as addresses."""
    got = run_native(server, LAYOUTS)
    assert [line.split()[1] for line in got] == [
        "transposed",
        "strided",
        "norm_strided",
        "shifted",
    ] * 2


CUTS = COMMON + textwrap.dedent(
    """
    def halved(model):  # same address, half the rows: PyTorch raises at the next product
        w = model.blocks[0].ffn.fc.weight
        w.data = w.data[: w.shape[0] // 2]

    def reinterpreted(model):  # same address and shape, int32: PyTorch refuses the dtype
        w = model.blocks[1].attn.qkv.weight
        w.data = w.data.view(torch.int32)

    def freed(model):  # the storage freed under the weight: PyTorch refuses the storage
        model.blocks[0].attn.proj.weight.untyped_storage().resize_(0)

    cases = (halved, reinterpreted, freed)
    for guards, change in itertools.product((native_facts.TensorGuards, None), cases):
        native_facts.TensorGuards = guards
        calls.clear()
        fast = decode(tiny(), change)
        slow = decode(tiny(), change, fused=False)
        assert isinstance(slow, RuntimeError), (change.__name__, slow)
        assert isinstance(fast, RuntimeError), (change.__name__, "decoded where PyTorch raises")
        assert calls[0] and not any(calls[1:]), (change.__name__, calls)  # none after
        print("ok", change.__name__)
    """
)


def test_a_weight_cut_or_retyped_in_place_declines_where_pytorch_raises(server):
    """``p.data = p.data[:half]`` keeps the address: the one call decoded on with the old
    shape where PyTorch raises."""
    got = run_native(server, CUTS)
    assert [line.split()[1] for line in got] == ["halved", "reinterpreted", "freed"] * 2


SUBCLASS = COMMON + textwrap.dedent(
    """
    import os, subprocess, sys
    from torch.testing._internal.two_tensor import TwoTensor

    def two(t):
        return TwoTensor(t.detach().clone(), t.detach().clone())

    def generated(model):
        ids = torch.tensor([[3, 1, 4, 1, 5]])
        out = zoo.generate(model, ids, max_new_tokens=12, temperature=0)
        return getattr(out, "a", out)  # a TwoTensor's first half

    model = tiny()
    want = generated(model)
    assert len(set(want[0, 5:].tolist())) > 2  # tokens that vary, so a wrong one shows
    fc = model.blocks[0].ffn.fc
    fc.weight = torch.nn.Parameter(two(fc.weight), requires_grad=False)
    assert fc.weight.data_ptr() == 0 and fc.weight.is_contiguous()  # what the C would read
    calls.clear()
    native_block.decode = counted
    got = generated(model)
    native_block.decode = fused_decode
    assert torch.equal(got, want), (got, want)
    assert calls and not any(calls), calls
    print("ok one weight")

    model = tiny()
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                setattr(module, name, torch.nn.Parameter(two(p), requires_grad=False))
    assert torch.equal(generated(model), want)
    print("ok every weight")

    # the per-module kernels decline subclasses and freed storage alike
    from zoo.kernels import native
    x, w, b = torch.randn(1, 8), torch.randn(6, 8), torch.randn(6)
    assert native.linear(x, w, b) is not None
    for args in ((two(x), w, b), (x, two(w), b), (x, w, two(b))):
        assert native.linear(*args) is None
    assert native.layer_norm(two(x), None, None, 1e-5) is None
    assert native.layer_norm(x, two(torch.ones(8)), None, 1e-5) is None
    assert native.rms_norm(two(x), torch.ones(8), 1e-5) is None
    assert native.rms_norm(x, two(torch.ones(8)), 1e-5) is None
    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    ck, cv = torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 16, 8)
    assert native.attend_one(q, k, v, ck, cv, 0, 0.3) is not None
    for i in range(5):
        args = [q, k, v, ck, cv]
        args[i] = two(args[i])
        assert native.attend_one(*args, 1, 0.3) is None, i
    gone = torch.randn(6, 8)
    gone.untyped_storage().resize_(0)
    assert native.linear(x, gone, b) is None
    short = torch.randn(6, 8)
    short.untyped_storage().resize_(16)
    assert native.linear(x, short, b) is None
    short_cache = torch.zeros(1, 2, 16, 8)
    short_cache.untyped_storage().resize_(64)
    assert native.attend_one(q, k, v, short_cache, cv, 0, 0.3) is None
    print("ok per-module")

    # a key/value cache whose storage shrank under it: the one call declines
    model = tiny()
    c = model.config
    cache = KVCache(c.n_layers, 1, c.n_heads, 16, c.head_size, dtype=torch.float32,
                    device=torch.device("cpu"))
    step = (torch.tensor([[9]]), torch.tensor([[3]]), cache, lambda positions: None)
    with torch.inference_mode():
        session_logits(model, torch.tensor([[3, 1, 4]]), None, torch.arange(3)[None], cache=cache)
        assert fused_decode(model, *step) is not None
        cache.layers[1].v.untyped_storage().resize_(64)
        assert fused_decode(model, *step) is None
    print("ok cache")

    # int8: the input row and the rows the kernel reads
    from zoo.quant.layers import quantize_
    model = tiny()
    quantize_(model, "int8")
    layer = model.blocks[0].attn.qkv
    from zoo.kernels.native_int8 import int8_linear, rows_of
    assert int8_linear(layer, x.new_ones(1, 32)) is not None
    assert int8_linear(layer, two(x.new_ones(1, 32))) is None
    rows_of(layer).colsum.untyped_storage().resize_(0)
    assert int8_linear(layer, x.new_ones(1, 32)) is None
    print("ok int8")
    """
)


def test_a_tensor_subclass_is_never_handed_to_the_kernels(server):
    """A ``TwoTensor`` weight reports float32, CPU, contiguous and address 0: ``zoo.generate``
    died with SIGSEGV (exit 139); it now decodes to PyTorch's tokens."""
    got = run_native(server, SUBCLASS)
    assert got == ["ok one weight", "ok every weight", "ok per-module", "ok cache", "ok int8"]


ABI = textwrap.dedent(
    """
    import os, warnings
    import torch
    from zoo.kernels import native, native_abi, native_load

    lib = native._library()
    assert lib is not None and native_abi.layout() == native_abi.built_layout(lib)

    def refused(why):
        native._library.cache_clear()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert native.available() is False, why
        text = " ".join(str(w.message) for w in seen)
        assert "pip install -e ." in text and "rebuild" in text, (why, text)
        x, w = torch.randn(1, 8), torch.randn(4, 8)
        assert native.linear(x, w) is None  # PyTorch's kernels, not the refused library's
        print("ok", why)

    version = native_abi.VERSION
    native_abi.VERSION = version + 1
    refused("version")
    native_abi.VERSION = version

    fields = native_abi.Norm._fields_
    class Norm(native_abi.ctypes.Structure):  # a mirror with one field more than the C
        _fields_ = fields + [("extra", native_abi.ctypes.c_int64)]
    native_abi.Norm, original = Norm, native_abi.Norm
    refused("size")
    native_abi.Norm = original

    native_load._SOURCE = "_ctypes"  # a loadable library without zoo's functions: a stale build
    refused("stale")
    """
)


def test_a_library_of_another_abi_is_refused_with_a_warning(server):
    """The ctypes mirrors of the C structures were never checked against the built library:
    a stale build was read with the wrong offsets, silently."""
    assert run_native(server, ABI) == ["ok version", "ok size", "ok stale"]
