"""A build that cannot fit is refused before anything is allocated."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import zoo
from zoo.errors import InsufficientMemoryError
from zoo.memory import available_memory, check_build_fits, format_bytes, tensor_bytes

#: Each size within its bound; together 3.3e12 parameters (13.2 TB in float32).
HUGE = {"d_model": 8192, "n_heads": 64, "d_ff": 32768, "n_layers": 4096}


@pytest.mark.slow  # about 5 s: counting 4096 blocks on meta (and importing torch in a child)
def test_a_huge_build_is_refused_quickly_with_the_figure():
    """It used to grow to 9 GB before failing; now it is refused having allocated nothing."""
    # The peak is VmHWM, this process image's own: ru_maxrss carries over the RSS of the
    # process that started it (a pytest worker's gigabytes), as Linux keeps it across exec.
    code = (
        "import re, zoo\n"
        "try:\n"
        f"    zoo.build('gpt2-124m', **{HUGE!r})\n"
        "except zoo.errors.InsufficientMemoryError as exc:\n"
        "    print('refused:', exc)\n"
        "status = open('/proc/self/status').read()\n"
        "print('maxrss_mb', int(re.search(r'VmHWM:\\s+(\\d+)', status)[1]) // 1024)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "refused: building gpt2-124m (3,299,391,201,280 parameters)" in run.stdout
    assert "needs about 13.2 TB" in run.stdout and "ZOO_ALLOW_LARGE=1" in run.stdout
    assert "device='meta'" in run.stdout
    maxrss = int(run.stdout.split("maxrss_mb")[1])
    assert maxrss < 1500, f"the refused build still used {maxrss} MB"


def test_a_huge_model_still_builds_on_meta():
    model = zoo.build("gpt2-124m", device="meta", **{**HUGE, "n_layers": 64})
    assert tensor_bytes(model)[0] == sum(p.numel() for p in set(model.parameters()))


def test_the_check_uses_the_memory_it_is_given(monkeypatch):
    meta = zoo.build("gpt2-124m", device="meta", n_layers=2)
    _, needed = tensor_bytes(meta)
    cpu = torch.device("cpu")
    check_build_fits(meta, device=cpu, dtype=None, what="m", available=needed)  # just fits
    with pytest.raises(InsufficientMemoryError, match=rf"needs about {format_bytes(needed)}"):
        check_build_fits(meta, device=cpu, dtype=None, what="m", available=needed - 1)
    # bfloat16: built in float32, then converted: both copies are held for a moment
    with pytest.raises(InsufficientMemoryError, match="needs about"):
        check_build_fits(meta, device=cpu, dtype=torch.bfloat16, what="m", available=needed)
    monkeypatch.setenv("ZOO_ALLOW_LARGE", "1")
    check_build_fits(meta, device=cpu, dtype=None, what="m", available=0)
    check_build_fits(meta, device=torch.device("meta"), dtype=None, what="m", available=0)


def test_available_memory_is_known_here():
    free = available_memory("cpu")
    assert free is not None and free > 0
    assert available_memory("meta") is None


def test_ordinary_builds_are_unchanged():
    """The check's meta build draws no random numbers: seeded weights are what they were."""
    arch, _, config = zoo.api.resolve_config("gpt1", n_layers=1)
    torch.manual_seed(0)
    direct = arch.model_class(config)
    torch.manual_seed(0)
    built = zoo.build("gpt1", n_layers=1)
    pairs = zip(direct.state_dict().values(), built.state_dict().values(), strict=True)
    assert all(torch.equal(x, y) for x, y in pairs)
