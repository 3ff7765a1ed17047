"""Does one client's chat request stall every other? ``/health``'s latency while hostile
``/v1/chat/completions`` requests (110,000 one-word messages, 3.7 MB each) are handled by a
real ``zoo serve`` process.

The model is a random ``llama-tiny`` (context 32,768) with Qwen2.5's chat template over a
byte-level tokenizer (the test suite's chat folder), so the model's own time is nothing and
what is measured is the server's handling of the request: parsing, rendering, tokenizing and
the checks. ``/health`` is polled every 20 ms from another thread while 1, then 4, hostile
requests run at once::

    python benchmarks/bench_serve_stall.py [--messages 110000] [--rounds 2]

Set ``PYTHONPATH`` to another checkout's root to measure its ``zoo`` (the server process
inherits it).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def chat_model(folder: Path) -> Path:
    """A random llama-tiny with Qwen2.5's chat template, saved in ``folder``."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from chat_folders import write_folder

    import zoo
    import zoo.tokenizers

    tok = zoo.tokenizers.load_folder(write_folder(folder / "tokenizer", "qwen2.5-instruct"))
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", vocab_size=tok.vocab_size, context_length=32768)
    return Path(zoo.save(model.eval(), folder / "model", tokenizer=tok))


class Server:
    def __init__(self, model: Path, folder: Path) -> None:
        out = folder / "stdout.txt"
        command = [sys.executable, "-m", "zoo.cli", "serve", str(model), "--port", "0",
                   "--served-model-name", "m", "--log-level", "warning"]  # fmt: skip
        with open(out, "w") as stdout, open(folder / "stderr.txt", "w") as stderr:
            self.process = subprocess.Popen(command, stdout=stdout, stderr=stderr,
                                            env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
        deadline = time.monotonic() + 120
        while "listening on" not in out.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit((folder / "stderr.txt").read_text()[-3000:])
            time.sleep(0.1)
        self.port = int(out.read_text().split("listening on ")[1].split(":")[2].split("/")[0])

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            headers = {"Content-Type": "application/json"}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def hostile(messages: int) -> bytes:
    conversation = [{"role": "user", "content": "hi"}] * messages
    return json.dumps({"model": "m", "messages": conversation, "max_tokens": 1}).encode()


def attack(server: Server, body: bytes, clients: int) -> dict[str, Any]:
    """``clients`` hostile requests at once while /health is polled: the longest /health
    answer, and the hostile requests' statuses and seconds."""
    done = threading.Event()
    results: list[tuple[int, float, str]] = []

    def one() -> None:
        start = time.perf_counter()
        status, reply = server.request("POST", "/v1/chat/completions", body)
        code = json.loads(reply).get("error", {}).get("code") if status != 200 else "ok"
        results.append((status, time.perf_counter() - start, str(code)))

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for thread in threads:
        thread.start()
    latencies = []
    time.sleep(0.05)
    while any(t.is_alive() for t in threads):
        start = time.perf_counter()
        status, _ = server.request("GET", "/health")
        latencies.append(time.perf_counter() - start)
        assert status == 200
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    done.set()
    return {
        "clients": clients,
        "health_max_s": max(latencies, default=0.0),
        "health_polls": len(latencies),
        "requests_s": max(r[1] for r in results),
        "statuses": sorted({f"{r[0]} {r[2]}" for r in results}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=110_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = Server(chat_model(folder), folder)
        try:
            body = hostile(args.messages)
            print(f"zoo from {os.environ.get('PYTHONPATH') or ROOT}")
            print(f"hostile body: {args.messages} messages, {len(body):,} bytes")
            print(
                "| clients | round | /health longest (s) | polls | hostile requests (s) | answers |"
            )
            print("|---:|---:|---:|---:|---:|---|")
            for clients in (1, 4):
                for round_ in range(args.rounds):
                    r = attack(server, body, clients)
                    print(f"| {clients} | {round_ + 1} | {r['health_max_s']:.3f} | "
                          f"{r['health_polls']} | {r['requests_s']:.2f} | "
                          f"{', '.join(r['statuses'])} |", flush=True)  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    main()
