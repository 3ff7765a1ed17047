"""Every environment variable zoo reads itself in one table: its name, type, default and
meaning (the ``ZOO_*`` variables, and ``XDG_CACHE_HOME`` for the default cache folder).

The environment is read here only, by :meth:`Settings.from_env`, which the public entry
points call where a call begins (``zoo.generate``, building the registry, a Hub pull,
``zoo.build``, finding cached verifications and local weights); the values are passed down
from there, so model code never reads the environment. A value zoo cannot read is a
:class:`~zoo.errors.ConfigError` naming the variable, never a silent default.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

from .errors import ConfigError

__all__ = ["VARIABLES", "Settings", "threads_argument"]


class _Refused(ValueError):
    """A value a parser read but refuses; its message says what the variable must be."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _flag(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE | _FALSE:
        return word in _TRUE
    raise _Refused("must be 1 or 0 (or true/false, yes/no, on/off)")


def _names(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _paths(text: str) -> tuple[str, ...]:
    return tuple(p for p in text.split(os.pathsep) if p)


def _seconds(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise _Refused("must be a number of seconds > 0")
    return value


def _bytes(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise _Refused("must be a whole number of bytes > 0")
    return value


#: ``ZOO_NATIVE_ISA``'s words: the instruction sets zoo's kernels have a variant for.
NATIVE_ISAS = ("avx2", "avx512")


def _isa(text: str) -> str | None:
    word = text.strip().lower()
    if word == "auto":
        return None
    if word not in NATIVE_ISAS:
        raise _Refused(f"must be auto or one of {', '.join(NATIVE_ISAS)}")
    return word


def threads_argument(setting: int | None) -> int | Literal["auto"] | None:
    """A threads setting (``decode_threads``, ``train_threads``) as the ``threads=`` argument
    of ``zoo.generate`` and ``zoo.train.train``: unset is ``"auto"`` (the cores other
    processes leave free), ``0`` is ``None`` (torch's count, untouched), ``N`` is ``N``."""
    return "auto" if setting is None else (setting or None)


def _threads(text: str) -> int | None:
    word = text.strip().lower()
    if word == "auto":
        return None
    value = int(word)
    most = max(_MAX_THREADS, os.cpu_count() or 1)
    if not 0 <= value <= most:  # 2**62 overflowed in torch; 100,000 could not start
        raise _Refused(
            f"must be auto, 0 (leave torch's thread count alone) or a thread count from 1 to "
            f"{most} (this machine has {os.cpu_count()} cores)"
        )
    return value


#: The most decoding threads ``ZOO_DECODE_THREADS`` names (or the cores, where more).
_MAX_THREADS = 256


def _secret(text: str) -> str:
    return text.strip()  # checked where it is used, so that no error message repeats it


def _path(text: str) -> str:
    return os.path.expanduser(text)


@dataclasses.dataclass(frozen=True)
class Settings:
    """zoo's settings from the environment (each field's variable is in :data:`VARIABLES`).

    Args:
        cuda_graphs: ``ZOO_CUDA_GRAPHS``: record CUDA graphs for decoding on a GPU.
        strict_plugins: ``ZOO_STRICT_PLUGINS``: a plugin failure raises instead of being
            recorded.
        prefer: ``ZOO_PREFER``: sources that win a name conflict, comma-separated.
        registry_path: ``ZOO_REGISTRY_PATH``: extra registry files (``os.pathsep``-separated).
        allow_large: ``ZOO_ALLOW_LARGE``: skip the memory checks before a build or a run.
        hub_deadline: ``ZOO_HUB_DEADLINE``: seconds a whole Hub pull may take.
        hub_stall_timeout: ``ZOO_HUB_STALL_TIMEOUT``: seconds the Hub may send nothing.
        hub_max_file_bytes: ``ZOO_HUB_MAX_FILE_BYTES``: the largest file but the weights.
        hub_max_bytes: ``ZOO_HUB_MAX_BYTES``: the largest weights file (or shard) a Hub
            download may bring, whatever size the Hub declares (default 64 GiB).
        dist_timeout: ``ZOO_DIST_TIMEOUT``: seconds a distributed collective may wait.
        cache_dir: ``ZOO_CACHE_DIR``: zoo's cache folder (default ``$XDG_CACHE_HOME/zoo``;
            :attr:`cache_root` is the folder in use).
        weights_dir: ``ZOO_WEIGHTS_DIR``: a folder of checkpoints, one per named model.
        api_key: ``ZOO_API_KEY``: the key ``zoo serve`` requires (``Authorization: Bearer``);
            never shown in the settings' ``repr``.
        xdg_cache_home: ``XDG_CACHE_HOME``: the user's cache folder (default ``~/.cache``),
            where zoo's is unless ``ZOO_CACHE_DIR`` says otherwise.
        decode_threads: ``ZOO_DECODE_THREADS``: threads of a CPU decoding step of
            ``zoo generate``, ``zoo chat`` and ``zoo serve`` (``zoo.generate`` leaves torch's
            count alone unless passed ``threads=``): ``auto``
            (default, ``None``: the cores other processes leave free, at most torch's count;
            :class:`zoo.kernels.threads.DecodeThreads`), ``0`` (torch's count, untouched) or a
            count.
        train_threads: ``ZOO_TRAIN_THREADS``: threads of a CPU training step of ``zoo
            train`` (``zoo.train.train`` leaves torch's count alone unless passed
            ``threads=``): ``auto`` (default, ``None``: the cores other processes leave free,
            re-read as the run goes, as decoding chooses), ``0`` (torch's count) or a count.
        native_kernels: ``ZOO_NATIVE_KERNELS``: batch-1 CPU decoding (one row's products,
            norms and attention) on zoo's own kernels where they are built (default on;
            :mod:`zoo.kernels.native`); ``0`` keeps PyTorch's.
        native_isa: ``ZOO_NATIVE_ISA``: the instruction set zoo's kernels run on (every
            variant computes the same bits): ``auto`` (default, ``None``: the widest this CPU
            has), ``avx2`` or ``avx512`` (a set this CPU lacks is refused with a warning, and
            ``auto``'s runs).
    """

    cuda_graphs: bool = True
    strict_plugins: bool = False
    prefer: tuple[str, ...] = ()
    registry_path: tuple[str, ...] = ()
    allow_large: bool = False
    hub_deadline: float | None = None
    hub_stall_timeout: float | None = None
    hub_max_file_bytes: int | None = None
    hub_max_bytes: int | None = None
    dist_timeout: float = 120.0
    cache_dir: str | None = None
    weights_dir: str | None = None
    api_key: str | None = dataclasses.field(default=None, repr=False)
    xdg_cache_home: str | None = None
    decode_threads: int | None = None
    train_threads: int | None = None
    native_kernels: bool = True
    native_isa: str | None = None

    @property
    def cache_root(self) -> str:
        """zoo's cache folder: ``cache_dir``, else ``zoo`` in ``xdg_cache_home`` (or in
        ``~/.cache``)."""
        if self.cache_dir:
            return self.cache_dir
        home = self.xdg_cache_home or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(home, "zoo")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings the environment (default ``os.environ``) gives; unset or empty
        variables keep their defaults."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, (variable, parse) in VARIABLES.items():
            text = environ.get(variable, "")
            if not text.strip():
                continue
            try:
                values[field] = parse(text)
            except ValueError as exc:
                reason = str(exc) if isinstance(exc, _Refused) else f"is not valid ({exc})"
                raise ConfigError(f"{variable}={text!r} {reason}") from None
        return cls(**values)


#: Field of :class:`Settings` -> (environment variable, parser of its text).
VARIABLES: Mapping[str, tuple[str, Callable[[str], Any]]] = {
    "cuda_graphs": ("ZOO_CUDA_GRAPHS", _flag),
    "strict_plugins": ("ZOO_STRICT_PLUGINS", _flag),
    "prefer": ("ZOO_PREFER", _names),
    "registry_path": ("ZOO_REGISTRY_PATH", _paths),
    "allow_large": ("ZOO_ALLOW_LARGE", _flag),
    "hub_deadline": ("ZOO_HUB_DEADLINE", _seconds),
    "hub_stall_timeout": ("ZOO_HUB_STALL_TIMEOUT", _seconds),
    "hub_max_file_bytes": ("ZOO_HUB_MAX_FILE_BYTES", _bytes),
    "hub_max_bytes": ("ZOO_HUB_MAX_BYTES", _bytes),
    "dist_timeout": ("ZOO_DIST_TIMEOUT", _seconds),
    "cache_dir": ("ZOO_CACHE_DIR", _path),
    "weights_dir": ("ZOO_WEIGHTS_DIR", _path),
    "api_key": ("ZOO_API_KEY", _secret),
    "xdg_cache_home": ("XDG_CACHE_HOME", str),
    "decode_threads": ("ZOO_DECODE_THREADS", _threads),
    "train_threads": ("ZOO_TRAIN_THREADS", _threads),
    "native_kernels": ("ZOO_NATIVE_KERNELS", _flag),
    "native_isa": ("ZOO_NATIVE_ISA", _isa),
}
