"""A run's resumable state, ``<out>/checkpoint/``: the model (a zoo checkpoint), the
optimizer's tensors and the RNG states (safetensors), step, settings and history (JSON). Never
pickle. Keyed by parameter names, so it loads on another number of processes.

A LoRA run (:mod:`zoo.train.adapter`) keeps its adapters' weights instead of the model
(``adapter.safetensors``) and records the adapter's shape and the base's fingerprint in
``trainer.json``: it resumes only with the same adapter on the same base.

Everything read back is checked against the model and the settings before any step: a damaged
or tampered file (a tensor of the wrong shape would make the fused AdamW write past its end) is
a :class:`~zoo.train.errors.ResumeError` naming what is wrong, never a crash or a silent NaN.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .. import jsonfile
from ..checkpoint import load_local, save
from ..checkpoint.commit import atomic_directory
from ..checkpoint.state import all_finite
from ..errors import ZooError
from ..nn.base import ZooModel
from ..plugin.current import get_registry
from .config import TrainConfig
from .errors import ResumeError

if TYPE_CHECKING:
    from .adapter import AdapterRun

__all__ = ["has_state", "load_state", "plain_model", "save_state"]

_STATE = "trainer.json"
_TENSORS = "state.safetensors"
_ADAPTER = "adapter.safetensors"  # a LoRA run's adapters, instead of the model
_FIELDS = ("step", "exp_avg", "exp_avg_sq")  # AdamW's state per parameter
_HOW = "delete it to start the run again, or train into another --out"


def has_state(out: Path) -> bool:
    """Whether ``out`` holds a run to resume."""
    return (out / "checkpoint" / _STATE).exists()


def _full() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True)


def plain_model(model: ZooModel) -> ZooModel:
    """``model`` with whole tensors on the CPU, as zoo.save takes it: the model itself, or a
    copy assembled from the full state dict when FSDP shards it (a collective call: every
    rank must make it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return model
    state: dict[str, Any] = get_model_state_dict(model, options=_full())
    registry = get_registry()
    arch, _, config = registry.resolve(model.config)
    with torch.device("cpu"):
        plain: ZooModel = registry.model_factory(arch)(config)
    plain.load_state_dict({k: v.cpu() for k, v in state.items()})
    plain.name = model.name
    return plain


def save_state(
    out: Path,
    model: ZooModel,
    optimizer: torch.optim.Optimizer,
    step: int,
    generator: torch.Generator,
    history: list[dict[str, Any]],
    config: TrainConfig,
    *,
    main: bool,
    tokenizer: Any = None,
    adapter: AdapterRun | None = None,
) -> None:
    """Write the resumable state atomically (collective under FSDP; only ``main`` writes);
    ``checkpoint/model`` gets ``tokenizer`` with the weights, so it loads as a whole model.
    With ``adapter`` (a LoRA run) only the adapters' weights are kept, not the base's."""
    import safetensors.torch
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from .adapter import trainable_state

    plain = plain_model(model) if adapter is None else model
    state: Any = get_optimizer_state_dict(model, optimizer, options=_full())
    if not main:
        return
    tensors: dict[str, Tensor] = {
        "rng.torch": torch.get_rng_state(),
        "rng.data": generator.get_state(),
    }
    scalars: dict[str, Any] = {}
    for name, values in state["state"].items():
        for key, value in values.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer/{name}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{name}/{key}"] = value
    meta = {
        "step": step,
        "config": config.trajectory(),
        "param_groups": state["param_groups"],
        "scalars": scalars,
        "history": history,
    }
    if adapter is not None:
        meta["adapter"] = adapter.record()
    with atomic_directory(out / "checkpoint") as staging:
        if adapter is None:
            save(plain, staging / "model", tokenizer=tokenizer)
        else:
            safetensors.torch.save_file(trainable_state(model), str(staging / _ADAPTER))
        safetensors.torch.save_file(tensors, str(staging / _TENSORS))
        text = json.dumps(meta, indent=1, allow_nan=False)  # never bare NaN: valid JSON
        (staging / _STATE).write_text(text, encoding="utf-8")


def load_state(
    out: Path,
    model: ZooModel,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    config: TrainConfig,
    adapter: AdapterRun | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """Check ``<out>/checkpoint/`` against ``model``, ``optimizer``, ``config`` and (a LoRA
    run) ``adapter``, then load it into them; returns the step reached and the history.
    Raises :class:`ResumeError` (nothing is loaded) when anything does not fit."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    folder = out / "checkpoint"
    meta = _read_meta(folder, config)
    step: int = meta["step"]
    _check_adapter(folder, meta.get("adapter"), adapter)
    tensors = _read_tensors(folder)
    weights = _saved_weights(folder, model, adapter is not None)
    fresh: Any = get_optimizer_state_dict(model, optimizer, options=_full())  # collective
    state = _optimizer_state(folder, tensors, meta, model, step)
    groups = _param_groups(folder, meta["param_groups"], fresh["param_groups"])
    rng = {"rng.torch": torch.get_rng_state(), "rng.data": generator.get_state()}
    for key, now in rng.items():
        _check_tensor(folder, key, tensors.get(key), now.shape, now.dtype)
    unknown = sorted(set(tensors) - set(rng) - {k for k in tensors if k.startswith("optimizer/")})
    if unknown:
        raise ResumeError(f"{folder / _TENSORS}: unknown tensors {unknown[:5]}; {_HOW}")

    if adapter is None:
        set_model_state_dict(model, weights, options=_full())
    else:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value)
    full: Any = {"state": state, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, full, options=_full())
    torch.set_rng_state(tensors["rng.torch"])
    generator.set_state(tensors["rng.data"])
    return step, meta["history"]


# -- checks ----------------------------------------------------------------------------------
def _saved_weights(folder: Path, model: ZooModel, adapter: bool) -> dict[str, Any]:
    """The saved model's state dict, or a LoRA run's adapter weights, checked against
    ``model``."""
    if adapter:
        return _saved_adapter(folder, model)
    try:
        saved = load_local(folder / "model", tokenizer=False)
    except ZooError as exc:
        raise ResumeError(f"{folder / 'model'} cannot be resumed: {exc}") from exc
    _check_model(folder, saved, model)
    return saved.state_dict()


def _saved_adapter(folder: Path, model: ZooModel) -> dict[str, Tensor]:
    """A LoRA run's ``adapter.safetensors``: the model's trainable parameters, each of its
    shape and dtype and finite."""
    import safetensors.torch

    path = folder / _ADAPTER
    try:
        saved = safetensors.torch.load_file(str(path))
    except Exception as exc:  # a damaged or missing file: safetensors' own error, OSError
        raise ResumeError(f"{path} cannot be read ({exc}); {_HOW}") from None
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    names = sorted(set(saved) ^ set(params))
    if names:
        raise ResumeError(f"{path} does not hold this run's adapters (differ: {names[:3]}); {_HOW}")
    for name, p in params.items():
        _check_tensor(folder, name, saved[name], p.shape, p.dtype, _ADAPTER)
    return saved


def _check_adapter(folder: Path, saved: Any, adapter: AdapterRun | None) -> None:
    """A LoRA run resumes only as the same LoRA on the same base; a full run only as one."""
    now = None if adapter is None else adapter.record()
    if saved == now:
        return
    if now is None:
        rank = saved.get("rank") if isinstance(saved, dict) else "?"
        raise ResumeError(
            f"{folder} holds a LoRA run (rank {rank}): resume it with the same --lora settings "
            f"and base, or {_HOW}"
        )
    if not isinstance(saved, dict):
        raise ResumeError(f"{folder} holds a run that trained the whole model, not a LoRA; {_HOW}")
    if saved.get("base_sha256") != now["base_sha256"]:
        raise ResumeError(
            f"{folder} trained an adapter on another base (sha256 {saved.get('base_sha256')!s:.16}"
            f"..., this base is {now['base_sha256']:.16}...): resume on the base it started "
            f"from, or {_HOW}"
        )
    changed = [
        f"{k} {saved.get(k)!r:.60} (now {v!r:.60})" for k, v in now.items() if saved.get(k) != v
    ]
    raise ResumeError(
        f"{folder} was written by a LoRA run of another shape: {', '.join(changed)}. Resume "
        f"with the same --lora settings, or {_HOW}"
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_meta(folder: Path, config: TrainConfig) -> dict[str, Any]:
    path = folder / _STATE
    try:
        meta = jsonfile.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ResumeError(f"{path} is not valid JSON ({exc}); {_HOW}") from None
    if not isinstance(meta, dict):
        raise ResumeError(f"{path} must hold a JSON object, got {type(meta).__name__}; {_HOW}")
    kinds = {"step": int, "param_groups": list, "scalars": dict, "history": list}
    for key, kind in kinds.items():
        value = meta.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ResumeError(
                f"{path}: {key!r} must be a JSON {kind.__name__}, got {value!r:.80}; {_HOW}"
            )
    _check_settings(folder, path, meta, config)
    step = meta["step"]
    if not 0 <= step <= config.steps:
        raise ResumeError(f"{path}: step {step} is not in 0..{config.steps} (steps); {_HOW}")
    _check_history(path, meta["history"], step)
    return meta


def _check_settings(folder: Path, path: Path, meta: dict[str, Any], config: TrainConfig) -> None:
    """The run in ``folder`` was started with ``config``'s settings: another run's folder
    (an --out given twice) is said to be one, before any of its values is judged by these
    settings (its step past these --steps read as a damaged file)."""
    saved = meta.get("config")
    if saved is None:  # runs written before settings were recorded: nothing to compare
        return
    if not isinstance(saved, dict):
        raise ResumeError(f"{path}: 'config' must be a JSON object; {_HOW}")
    now = config.trajectory()
    changed = [f"{k} {saved.get(k)!r} (now {v!r})" for k, v in now.items() if saved.get(k) != v]
    if changed:
        raise ResumeError(
            f"{folder.parent} already holds another training run, started with other "
            f"settings: {', '.join(changed)}. To start a new run, train into another --out "
            f"(or delete {folder.parent}); to continue that run, repeat its settings; to "
            f"fine-tune its weights: --from {folder / 'model'}"
        )


def _check_history(path: Path, history: list[Any], step: int) -> None:
    """One record per step, numbered from 1, of numbers (or nulls)."""
    for i, record in enumerate(history):
        ok = isinstance(record, dict) and record.get("step") == i + 1
        ok = ok and all(v is None or _is_number(v) for k, v in record.items() if k != "step")
        if not ok:
            raise ResumeError(
                f"{path}: history[{i}] must be {{'step': {i + 1}, 'loss': number, ...}}, "
                f"got {record!r:.80}; {_HOW}"
            )
    if len(history) != step:
        raise ResumeError(f"{path}: {len(history)} history records for step {step}; {_HOW}")


def _read_tensors(folder: Path) -> dict[str, Tensor]:
    import safetensors.torch

    path = folder / _TENSORS
    try:
        return safetensors.torch.load_file(str(path))
    except Exception as exc:  # a damaged file: safetensors' own error type, OSError, ...
        raise ResumeError(f"{path} cannot be read ({exc}); {_HOW}") from None


def _check_tensor(
    folder: Path,
    key: str,
    value: Tensor | None,
    shape: torch.Size,
    dtype: torch.dtype,
    file: str = _TENSORS,
) -> Tensor:
    where = f"{folder / file}: {key!r}"
    if value is None:
        raise ResumeError(f"{where} is missing; {_HOW}")
    if value.shape != shape or value.dtype != dtype:
        raise ResumeError(
            f"{where} is {value.dtype} {tuple(value.shape)}, this model needs "
            f"{dtype} {tuple(shape)}; {_HOW}"
        )
    if not all_finite(value):
        raise ResumeError(f"{where} holds NaN or infinite values; {_HOW}")
    return value


def _check_model(folder: Path, saved: ZooModel, model: ZooModel) -> None:
    """Same tensors, same shapes, all finite (``model.state_dict()`` has global shapes under
    FSDP too)."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in saved.state_dict().items()}
    if want != have:
        diff = sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
        shown = ", ".join(f"{k}: {have.get(k)} (model {want.get(k)})" for k in diff[:3])
        raise ResumeError(
            f"{folder / 'model'} was written for another model ({shown}); resume with the "
            f"same model and --set values, or {_HOW}"
        )
    for key, value in saved.state_dict().items():
        if not all_finite(value):
            raise ResumeError(f"{folder / 'model'}: {key} holds NaN or infinite values; {_HOW}")


def _optimizer_state(
    folder: Path, tensors: dict[str, Tensor], meta: dict[str, Any], model: ZooModel, step: int
) -> dict[str, dict[str, Any]]:
    """The saved optimizer state per parameter name, each parameter's checked against it."""
    params = {name: p for name, p in model.named_parameters()}  # global shapes under FSDP
    state = _saved_optimizer_state(folder, tensors, meta, params)
    for name, fields in state.items():
        _check_parameter_state(folder, name, fields, params[name], step)
    return state


def _saved_optimizer_state(
    folder: Path, tensors: dict[str, Tensor], meta: dict[str, Any], params: Mapping[str, Tensor]
) -> dict[str, dict[str, Any]]:
    """The ``optimizer/<name>/<field>`` tensors and the scalars, grouped by parameter name;
    a name no parameter has or a field AdamW does not keep is refused."""
    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            _, name, field = [*key.split("/", 2), "", ""][:3]
            if name not in params or field not in _FIELDS:
                raise ResumeError(f"{folder / _TENSORS}: unknown tensor {key!r}; {_HOW}")
            state.setdefault(name, {})[field] = value
    for key, value in meta["scalars"].items():  # AdamW has none; kept for other optimizers
        name, _, field = str(key).partition("/")
        if name not in params or not _is_number(value) or not math.isfinite(value):
            raise ResumeError(f"{folder / _STATE}: bad scalar {key!r}: {value!r:.40}; {_HOW}")
        state.setdefault(name, {})[field] = value
    return state


def _check_parameter_state(
    folder: Path, name: str, fields: dict[str, Any], p: Tensor, step: int
) -> None:
    """AdamW's moments of parameter ``name`` fit it (second moment >= 0), and its step count
    is a whole number of steps in ``0..step``."""
    for field in ("exp_avg", "exp_avg_sq"):
        _check_tensor(folder, f"optimizer/{name}/{field}", fields.get(field), p.shape, p.dtype)
    if bool((fields["exp_avg_sq"] < 0).any()):
        raise ResumeError(f"{folder / _TENSORS}: optimizer/{name}/exp_avg_sq < 0; {_HOW}")
    count = fields.get("step")
    where = f"{folder / _TENSORS}: 'optimizer/{name}/step'"
    if not isinstance(count, Tensor) or count.shape != () or not count.is_floating_point():
        raise ResumeError(f"{where} must be a floating scalar tensor; {_HOW}")
    number = float(count)
    if not (math.isfinite(number) and number == int(number) and 0 <= number <= step):
        raise ResumeError(f"{where} is {number}, not a step in 0..{step}; {_HOW}")


def _param_groups(
    folder: Path, saved: list[Any], fresh: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The saved groups, each field of the type a new optimizer has, over the same
    parameters."""
    where = f"{folder / _STATE}: param_groups"
    if len(saved) != len(fresh):
        raise ResumeError(f"{where}: {len(saved)} groups, this optimizer has {len(fresh)}; {_HOW}")
    groups = []
    for i, (group, new) in enumerate(zip(saved, fresh, strict=True)):
        if not isinstance(group, dict) or set(group) != set(new):
            raise ResumeError(f"{where}[{i}] must have the fields {sorted(new)}; {_HOW}")
        for key, value in new.items():
            got = group[key]
            if not _group_field_ok(key, got, value):
                raise ResumeError(f"{where}[{i}].{key} is {got!r:.80}, not valid; {_HOW}")
        groups.append({**group, "betas": tuple(group["betas"])})
    return groups


def _group_field_ok(key: str, got: Any, fresh: Any) -> bool:
    """Whether a saved param-group field ``got`` may stand for a new optimizer's ``fresh``:
    the same parameters, valid betas, flags as flags, finite rates >= 0, else the same type."""
    if key == "params":
        return bool(got == fresh)
    if key == "betas":
        ok = isinstance(got, list) and len(got) == 2 and all(map(_is_number, got))
        return ok and all(math.isfinite(b) and 0 <= b < 1 for b in got)
    if isinstance(fresh, bool) or fresh is None:
        return got is None or isinstance(got, bool)
    if _is_number(fresh):
        return _is_number(got) and math.isfinite(got) and got >= 0
    return type(got) is type(fresh)
