"""``zoo serve``: a model behind the OpenAI HTTP API, with continuous batching.

- :mod:`zoo.serve.engine`: the thread that decodes every request's sequences in one batch
  that sequences join and leave between steps (:class:`zoo.nn.slots.SlotBatch`).
- :mod:`zoo.serve.app`: the FastAPI application (``/v1/models``, ``/v1/completions``,
  ``/v1/chat/completions``, server-sent events, errors in OpenAI's shape); requests pass
  :mod:`zoo.serve.guard` (API key, body size) first.
- :mod:`zoo.serve.server`: binds the socket and runs uvicorn; SIGTERM drains.

Needs the ``serve`` extra: ``pip install 'torch-zoo[serve]'`` (FastAPI and uvicorn).
"""

from __future__ import annotations

from .app import create_app
from .engine import Engine, Finish, QueueFull, Sequence
from .server import serve

__all__ = ["Engine", "Finish", "QueueFull", "Sequence", "create_app", "serve"]
