"""Running the server: bind the socket, start the engine, serve with uvicorn until a signal,
drain what is in flight, stop.

The engine decodes in the thread that calls :func:`serve` (for ``zoo serve``, the main
thread, where PyTorch's CPU kernels run fastest: see :class:`~zoo.serve.engine.Engine`);
uvicorn answers HTTP on a thread of its own. SIGTERM (and Ctrl+C) close the listening socket
at once, let every request in flight finish (up to ``drain_timeout`` seconds), then stop the
engine; after SIGTERM :func:`serve` returns normally, so ``zoo serve`` exits 0 (after Ctrl+C
it raises ``KeyboardInterrupt``).
"""

from __future__ import annotations

import math
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from .app import create_app
from .engine import DEFAULT_PREFIX_CACHE_BYTES, Engine
from .guard import DEFAULT_MAX_BODY_BYTES
from .limits import ACCEPT_BURST, Limits, bounded_protocol, connection_cap
from .prefill_budget import DEFAULT_MAX_STALL, DEFAULT_PREFILL_CHUNK

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..adapters.lora_bank import LoRAWeights
    from ..nn.decoder import DecoderLM
    from ..tokenizers import Tokenizer

__all__ = ["LOOPBACK", "bind", "http_server", "serve"]

#: Hosts only this machine reaches.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


#: Connections the kernel queues until the server accepts them.
BACKLOG = 2048


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (``port`` 0 picks a free one)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def serve(
    model: DecoderLM,
    tokenizer: Tokenizer,
    *,
    model_id: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    api_keys: Sequence[str] = (),
    shared_prefix_cache: bool = False,
    max_batch: int = 8,
    max_queue: int = 64,
    max_len: int | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    drain_timeout: float | None = 60.0,
    header_timeout: float = 10.0,
    body_timeout: float = 30.0,
    keep_alive: float = 5.0,
    max_connections: int | None = None,
    log_level: str = "info",
    ready: Callable[[str], None] | None = None,
    adapters: Mapping[str, LoRAWeights] | None = None,
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
    max_stall: float | None = DEFAULT_MAX_STALL,
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    decode_threads: int | None = None,
    compile: bool = False,
    cuda_graphs: bool = True,
) -> None:
    """Serve ``model`` over the OpenAI HTTP API until SIGTERM or Ctrl+C.

    Args:
        model: the decoder to serve.
        tokenizer: its tokenizer.
        model_id: the name clients pass as ``model``.
        host, port: where to listen (``port`` 0: any free port).
        api_key, api_keys: when any is set, every request needs ``Authorization: Bearer
            KEY`` with one of them; each key is a client of its own, whose prompts the
            requests of other keys never reuse from the prefix cache.
        shared_prefix_cache: let the requests of different keys share the prefix cache.
        max_batch, max_queue, max_len: see :class:`~zoo.serve.engine.Engine`.
        max_body_bytes: larger request bodies are refused (413).
        drain_timeout: seconds requests in flight may take to finish after SIGTERM
            (``None``: as long as they need).
        header_timeout, body_timeout, keep_alive: seconds a client may take to send a
            request's headers and its body, and an idle connection stays open: see
            :class:`~zoo.serve.limits.Limits`.
        max_connections: connections open at once (``None``: as many as the open-file
            limit leaves room for, at most 1024; see :func:`~zoo.serve.limits.connection_cap`).
        log_level: uvicorn's (``"warning"`` drops the line per request).
        ready: called with the base URL once the socket listens (default: print it).
        adapters: LoRA adapters by name, each served as a model of that name beside
            ``model_id`` (see :class:`~zoo.serve.engine.Engine`).
        prefill_chunk, max_stall, prefix_cache_bytes: prompt tokens prefilled per step at
            most (``None``: whole prompts), the decoding steps a prompt chunk may take while
            streams decode (``None``: no bound but ``prefill_chunk``), and the prefix cache's
            memory (0: none); see :class:`~zoo.serve.engine.Engine`.
        decode_threads: the CPU threads of each step (``None``: the cores other processes
            leave free; see :class:`~zoo.serve.engine.Engine`).
        compile, cuda_graphs: the decoding step compiled (CPU) or replayed as CUDA graphs;
            see :class:`~zoo.serve.engine.Engine`.
    """
    limits = Limits(header_timeout, body_timeout, keep_alive, connection_cap(max_connections))
    engine = Engine(
        model,
        max_batch=max_batch,
        max_queue=max_queue,
        max_len=max_len,
        adapters=adapters,
        prefill_chunk=prefill_chunk,
        max_stall=max_stall,
        prefix_cache_bytes=prefix_cache_bytes,
        decode_threads=decode_threads,
        compile=compile,
        cuda_graphs=cuda_graphs,
    )
    app = create_app(
        engine,
        tokenizer,
        model_id=model_id,
        api_key=api_key,
        api_keys=api_keys,
        shared_prefix_cache=shared_prefix_cache,
        max_body_bytes=max_body_bytes,
    )
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    where = f"[{host}]" if ":" in host else host
    url = f"http://{where}:{bound}/v1"
    server = http_server(app, limits, drain_timeout=drain_timeout, log_level=log_level)
    failed: list[BaseException] = []

    def http() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # raised again by the calling thread
            failed.append(exc)
        finally:
            engine.stop()  # the requests have drained: the engine's loop below returns

    # the engine decodes in this thread (the main one for `zoo serve`: see Engine), uvicorn
    # answers on its own; signals reach the main thread, which tells uvicorn to drain
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        server.handle_exit(signum, frame)  # a second Ctrl+C stops without draining

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS} if main else {}
    thread = threading.Thread(target=http, name="zoo-serve-http", daemon=True)
    try:
        (ready or _announce)(url)
        thread.start()
        engine.run()
    finally:
        server.should_exit = True  # for when the engine failed: stop serving too
        if thread.is_alive():
            thread.join()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        raise failed[0]
    if signal.SIGINT in received:  # Ctrl+C: as Python reports it, once drained
        raise KeyboardInterrupt


def http_server(
    app: Any, limits: Limits, *, drain_timeout: float | None = None, log_level: str = "info"
) -> uvicorn.Server:
    """The uvicorn server of ``app``, its connections bounded by ``limits``; run it with
    ``server.run(sockets=[bind(host, port)])``.

    Args:
        app: the ASGI application.
        limits: deadlines and the connection cap (see :mod:`zoo.serve.limits`).
        drain_timeout: seconds the requests in flight may take to finish once told to stop.
        log_level: uvicorn's.
    """
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_graceful_shutdown=None if drain_timeout is None else math.ceil(drain_timeout),
        lifespan="off",
        server_header=False,
        http=bounded_protocol(limits),
        ws="none",
        backlog=ACCEPT_BURST,  # asyncio accepts this many per wake-up (see _Server)
    )
    return _Server(config)


class _Server(uvicorn.Server):
    """uvicorn's server, with the kernel's queue of connections back at :data:`BACKLOG`
    once serving: asyncio uses its ``backlog`` both for ``listen`` and as the most
    connections it accepts at one wake-up, before the protocol can count them."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        for sock in sockets or []:
            sock.listen(BACKLOG)


#: The signals that stop the server after the requests in flight have finished.
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _announce(url: str) -> None:
    print(f"zoo serve: listening on {url} (Ctrl+C or SIGTERM to stop)", flush=True)
    sys.stdout.flush()
