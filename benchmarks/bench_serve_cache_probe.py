"""Can one client tell whether another client's prompt is in ``zoo serve``'s prefix cache?
First-token times of a guessed 528-token prompt that another client sent before, against a
prompt nobody sent, on a real ``zoo serve`` process.

The model is a random Llama (8 layers, width 512, byte tokenizer), large enough that a
528-token prefill takes a visible time on a CPU. Each trial: the victim (key ``sk-victim``)
sends a fresh random prompt; the prober (key ``sk-prober``, or the victim's own key with
``--keys 1``: the server before per-key isolation knew one key) sends the same prompt, then a
prompt nobody sent; then the victim sends its prompt again (a hit it should still get). Each
request streams one token and is timed to its first chunk; the prefix cache's hits are read
from ``/health`` before and after each request::

    python benchmarks/bench_serve_cache_probe.py [--keys 2] [--trials 8] [-- SERVE_ARGS...]

``SERVE_ARGS`` go to ``zoo serve`` (``--shared-prefix-cache`` shares the cache across keys).
Set ``PYTHONPATH`` to another checkout's root to measure its ``zoo``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VICTIM, PROBER = "sk-victim", "sk-prober"
PROMPT_TOKENS = 528


def model_folder(folder: Path) -> Path:
    import torch

    import zoo

    tok = zoo.load("shakespeare-byte").tokenizer
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", vocab_size=tok.vocab_size, context_length=2048,
                      d_model=512, n_heads=8, n_kv_heads=8, d_ff=1376, n_layers=8)  # fmt: skip
    return Path(zoo.save(model.eval(), folder / "model", tokenizer=tok))


class Server:
    def __init__(self, model: Path, folder: Path, keys: int, extra: list[str]) -> None:
        out, err = folder / "stdout.txt", folder / "stderr.txt"
        command = [sys.executable, "-m", "zoo.cli", "serve", str(model), "--port", "0",
                   "--served-model-name", "m", "--log-level", "warning", *extra]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "ZOO_API_KEY": VICTIM}
        if keys == 2:
            command += ["--api-key", VICTIM, "--api-key", PROBER]
            env.pop("ZOO_API_KEY")
        with open(out, "w") as stdout, open(err, "w") as stderr:
            self.process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)
        deadline = time.monotonic() + 120
        while "listening on" not in out.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(err.read_text()[-3000:])
            time.sleep(0.1)
        self.port = int(out.read_text().split("listening on ")[1].split(":")[2].split("/")[0])

    def hits(self, key: str) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request("GET", "/health", headers={"Authorization": f"Bearer {key}"})
            health = json.loads(connection.getresponse().read())
        finally:
            connection.close()
        return int(health["prefix_cache"]["hit_tokens"])

    def first_token(self, key: str, prompt: str) -> tuple[float, int]:
        """Seconds to the first streamed chunk, and the prompt tokens the cache gave."""
        before = self.hits(key)
        body = {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0,
                "stream": True}  # fmt: skip
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            start = time.perf_counter()
            connection.request("POST", "/v1/completions", json.dumps(body), headers)
            response = connection.getresponse()
            assert response.status == 200, response.read()
            line = response.readline()
            seconds = time.perf_counter() - start
            assert line.startswith(b"data: {"), line
            response.read()
        finally:
            connection.close()
        return seconds, self.hits(key) - before

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, choices=(1, 2), default=2)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("serve", nargs="*", help="more arguments of zoo serve")
    args = parser.parse_args()
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz     "

    def fresh() -> str:
        return "".join(rng.choice(letters) for _ in range(PROMPT_TOKENS))

    prober = PROBER if args.keys == 2 else VICTIM
    rows: dict[str, list[tuple[float, int]]] = {"guessed": [], "unsent": [], "victim again": []}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(model_folder(Path(tmp)), Path(tmp), args.keys, args.serve)
        try:
            server.first_token(VICTIM, fresh())  # warm up
            for _ in range(args.trials):
                secret = fresh()
                server.first_token(VICTIM, secret)
                rows["guessed"].append(server.first_token(prober, secret))
                rows["unsent"].append(server.first_token(prober, fresh()))
                rows["victim again"].append(server.first_token(VICTIM, secret))
        finally:
            server.stop()
    print(f"keys: {args.keys} ({'victim and prober share one' if args.keys == 1 else 'one each'})"
          f"{', zoo serve ' + ' '.join(args.serve) if args.serve else ''}; "
          f"{args.trials} trials of a {PROMPT_TOKENS}-token prompt")  # fmt: skip
    print("| prober's request | median first token (ms) | min-max (ms) | cache hits |")
    print("|---|---:|---:|---:|")
    for name, results in rows.items():
        ms = [s * 1000 for s, _ in results]
        hit = sum(1 for _, tokens in results if tokens)
        who = "victim's own, again" if name == "victim again" else name
        print(f"| {who} | {statistics.median(ms):.0f} | {min(ms):.0f}-{max(ms):.0f} | "
              f"{hit} of {len(results)} |")  # fmt: skip


if __name__ == "__main__":
    main()
