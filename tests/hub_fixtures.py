"""pytest fixtures that point the real ``huggingface_hub`` client at a :class:`LocalHub`.

Enable in ``tests/conftest.py`` with ``pytest_plugins = ["hub_fixtures"]``; then::

    def test_pull(local_hub):
        local_hub.add_files("org/name", {"config.json": b"{}"})
        path = huggingface_hub.hf_hub_download("org/name", "config.json")

Setting environment variables is not enough: ``huggingface_hub.constants`` reads them once, at
import time (``ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``,
``HF_HUB_DISABLE_XET``, ...), a few modules copy constants into their own namespace, and the
module-level ``huggingface_hub.hf_api.api`` (behind ``huggingface_hub.upload_file``,
``model_info``, ...) froze ``ENDPOINT`` when it was built. :func:`point_client_at` patches all of
them with ``monkeypatch``, so everything is restored after the test. Subprocesses (e.g. CLI tests)
only need the environment: pass ``hub_client_env(...)``.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hubserver import LocalHub

__all__ = [
    "HUB_TOKEN",
    "hub_client_env",
    "hub_offline",
    "instant_retries",
    "local_hub",
    "point_client_at",
    "set_offline",
]

#: The token the ``local_hub`` fixture accepts (and exports as ``HF_TOKEN``).
HUB_TOKEN = "hf_localhub_test_token"

# Variables that would otherwise leak in from the developer's environment.
_UNSET_ENV = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HUGGING_FACE_HUB_TOKEN",
    "HUGGINGFACE_HUB_CACHE",
    "HUGGINGFACE_ASSETS_CACHE",
    "HUGGINGFACE_CO_STAGING",
    "HF_OIDC_RESOURCE",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN",
    "HF_HUB_ENABLE_HF_TRANSFER",
    "XDG_CACHE_HOME",
)


def hub_client_env(endpoint: str, token: str, home: str | os.PathLike[str]) -> dict[str, str]:
    """Environment for a ``huggingface_hub`` client (in this or a child process) using a hub."""
    home = Path(home)
    return {
        "HF_ENDPOINT": endpoint,
        "HF_TOKEN": token,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    }


def _set(monkeypatch: pytest.MonkeyPatch, target: ModuleType | Any, name: str, value: Any) -> None:
    """Patch an attribute if this huggingface_hub version has it."""
    if hasattr(target, name):
        monkeypatch.setattr(target, name, value)


def point_client_at(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, token: str, home: str | os.PathLike[str]
) -> None:
    """Make the in-process ``huggingface_hub`` talk to ``endpoint`` with a cache under ``home``."""
    import huggingface_hub.hf_api
    from huggingface_hub import constants

    env = hub_client_env(endpoint, token, home)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in _UNSET_ENV:
        monkeypatch.delenv(key, raising=False)

    home = Path(home)
    hub_cache, assets = env["HF_HUB_CACHE"], env["HF_ASSETS_CACHE"]
    patched = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": hub_cache,
        "HUGGINGFACE_HUB_CACHE": hub_cache,
        "default_cache_path": hub_cache,
        "HF_ASSETS_CACHE": assets,
        "HUGGINGFACE_ASSETS_CACHE": assets,
        "default_assets_cache_path": assets,
        "HF_XET_CACHE": env["HF_XET_CACHE"],
        "HF_TOKEN_PATH": env["HF_TOKEN_PATH"],
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "CHECK_FOR_UPDATE_DONE_PATH": str(home / ".check_for_update_done"),
        "CHECK_FOR_SKILL_UPDATE_DONE_PATH": str(home / ".check_for_skill_update_done"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_UPDATE_CHECK": True,
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": False,
    }
    for name, value in patched.items():
        _set(monkeypatch, constants, name, value)
    if hasattr(constants, "HF_URL_HOSTS"):  # hosts whose redirects keep the auth header
        monkeypatch.setattr(constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {"127.0.0.1"})

    # Modules that did `from ..constants import NAME` hold their own copy.
    _patch_module_copies(monkeypatch, endpoint, hub_cache, assets)
    # `huggingface_hub.upload_file`, `model_info`, ... are methods of an HfApi built at import.
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", endpoint)


def _patch_module_copies(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, hub_cache: str, assets: str
) -> None:
    """Patch the import-time copies of constants and the agent-detection registry."""
    import importlib

    copies = {
        "huggingface_hub.utils._cache_manager": {"HF_HUB_CACHE": hub_cache},
        "huggingface_hub.utils._cache_assets": {"HF_ASSETS_CACHE": assets},
        "huggingface_hub.utils._git_credential": {"ENDPOINT": endpoint},
    }
    for module_name, values in copies.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, value in values.items():
            _set(monkeypatch, module, name, value)
    # User-agent building fetches `{ENDPOINT}/api/agent-harnesses` once per process: skip it.
    try:
        detect_agent = importlib.import_module("huggingface_hub.utils._detect_agent")
    except ImportError:
        return
    _set(monkeypatch, detect_agent, "_registry", {"standardEnvVars": [], "harnesses": {}})


def set_offline(monkeypatch: pytest.MonkeyPatch, offline: bool = True) -> None:
    """Switch ``HF_HUB_OFFLINE`` for the rest of the test (env var *and* the cached constant)."""
    from huggingface_hub import constants

    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)


class _NoSleepTime:
    """Stand-in for the ``time`` module whose ``sleep`` returns at once."""

    @staticmethod
    def sleep(seconds: float) -> None:
        """Do not wait."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def instant_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``huggingface_hub``'s retry back-off (1 s, 2 s, ... up to ~23 s) instant.

    Only the ``time`` name inside ``huggingface_hub.file_download`` (download resume loop) and
    ``huggingface_hub.utils._http`` (``http_backoff``) is replaced; the retries still happen.
    """
    import huggingface_hub.file_download
    import huggingface_hub.utils._http

    for module in (huggingface_hub.file_download, huggingface_hub.utils._http):
        _set(monkeypatch, module, "time", _NoSleepTime())


@pytest.fixture
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Switch ``HF_HUB_OFFLINE`` in this test: ``hub_offline(True)``, ``hub_offline(False)``."""
    return functools.partial(set_offline, monkeypatch)


@pytest.fixture
def local_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    """A fresh running :class:`LocalHub` (token :data:`HUB_TOKEN`) for this test, with the
    in-process client pointed at it, an empty cache in ``tmp_path / "hf_home"``, Xet, telemetry
    and offline mode off, and instant retry back-off. Stopped and cleaned up afterwards."""
    hub = LocalHub(token=HUB_TOKEN, root=tmp_path / "localhub")
    hub.start()
    try:
        point_client_at(monkeypatch, hub.endpoint, HUB_TOKEN, tmp_path / "hf_home")
        instant_retries(monkeypatch)
        yield hub
    finally:
        hub.close()
