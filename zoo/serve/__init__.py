"""``zoo serve``: a model behind the OpenAI HTTP API, with continuous batching.

- :mod:`zoo.serve.engine`: the loop that decodes every request in one batch that requests
  join and leave between steps; :meth:`~zoo.serve.engine.Engine.step` schedules, runs and
  updates, once. It stands on :mod:`zoo.serve.scheduler` (the queue, admission,
  cancellation and fairness; plain Python, no torch) and :mod:`zoo.serve.runner` (the
  requests' rows of a :class:`zoo.runtime.slots.SlotBatch` and one step); a
  :class:`~zoo.serve.request.Request` is one prompt and where its text goes. Token picking,
  stop handling and the text come from :mod:`zoo.generation`, as :func:`zoo.generate`'s.
- :mod:`zoo.serve.app`: the FastAPI application (``/v1/models``, ``/v1/completions``,
  ``/v1/chat/completions``, server-sent events, errors in OpenAI's shape, ``/health`` and
  Prometheus's ``/metrics`` from :mod:`zoo.serve.metrics`); requests pass
  :mod:`zoo.serve.guard` (API key, body size) first.
- :mod:`zoo.serve.server`: binds the socket and runs uvicorn; SIGTERM drains.

Needs the ``serve`` extra: ``pip install 'torch-zoo[serve]'`` (FastAPI, uvicorn and
``prometheus_client``).
Importing the package imports neither them nor torch: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if TYPE_CHECKING:  # type checkers see the real names
    from .app import create_app
    from .engine import Engine
    from .request import Finish, Request
    from .scheduler import QueueFull
    from .server import serve

#: Imported on first use: they import torch (and FastAPI).
_LAZY = {
    "create_app": "zoo.serve.app:create_app",
    "Engine": "zoo.serve.engine:Engine",
    "Finish": "zoo.serve.request:Finish",
    "Request": "zoo.serve.request:Request",
    "QueueFull": "zoo.serve.scheduler:QueueFull",
    "serve": "zoo.serve.server:serve",
}

__getattr__ = lazy_attributes(__name__, _LAZY)

__all__ = ["Engine", "Finish", "QueueFull", "Request", "create_app", "serve"]
