"""``zoo list``, ``info``, ``plugins``, ``tour`` and ``check``: what is installed and what it
is made of. ``list``, ``info`` and ``plugins`` import no torch."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .. import api
from ..errors import ZooError
from ..plugin.current import get_registry
from .checked import check_sources, checked_name
from .output import printable, table
from .parser import Command

if TYPE_CHECKING:
    from pathlib import Path

    from ..plugin.current import Registry
    from ..plugin.host import PluginInfo

__all__ = ["COMMANDS", "TOUR_MAX_MIB", "conflict_notes"]


def conflict_notes() -> list[tuple[str, str]]:
    """``(name, "conflict: A vs B")`` for each named model made unusable by a conflict (on its
    own name or on its architecture), with a note on stderr saying how to resolve each."""
    registry = get_registry()
    conflicts = registry.unresolved()
    rows = []
    for (kind, name), sources in conflicts.items():
        print(f"zoo: {printable(registry.conflict_message(kind, name))}", file=sys.stderr)
        if kind == "model":
            rows.append((name, f"conflict: {' vs '.join(sources)}"))
    architectures = {n: s for (k, n), s in conflicts.items() if k == "architecture"}
    for name in registry.models(include_unavailable=True):
        contested = architectures.get(registry.model(name).architecture)
        if contested:
            rows.append((name, f"conflict on its architecture: {' vs '.join(contested)}"))
    return sorted(rows)


def cmd_list(args: argparse.Namespace) -> int:
    """Print the named models (builds nothing, imports no torch)."""
    registry = get_registry()
    rows = []
    for name in registry.models(include_unavailable=args.all):
        spec = registry.model(name)
        available = spec.architecture in registry.architectures()
        rows.append(
            (
                name,
                spec.architecture + ("" if available else " (not installed)"),
                ", ".join(spec.aliases),
                "yes" if spec.weights else "",
                spec.description,
            )
        )
    for name in registry.adapters():
        adapter = registry.adapter(name)
        rows.append((name, f"LoRA adapter of {adapter.base}", "", "yes", adapter.description))
    rows += [(name, "-", "", "", note) for name, note in conflict_notes()]
    print(table(sorted(rows), ("model", "architecture", "aliases", "weights", "description")))
    _problem_notes()
    return 0


def _problem_notes() -> None:
    """Name each registry file that was skipped, and why, on stderr (its models are missing
    from the listing; everything else is there)."""
    for path, reason in get_registry().problems:
        print(f"zoo: skipped registry file {printable(path)}: {printable(reason)}", file=sys.stderr)


def tokenizer_line(info: api.ModelInfo) -> str:
    """The tokenizer of a model as ``zoo info`` and ``zoo tour`` show it."""
    if info.tokenizer is None:
        return "-"
    if info.tokenizer_description:
        return f"{info.tokenizer} ({info.tokenizer_description})"
    return info.tokenizer


def cmd_info(args: argparse.Namespace) -> int:
    """Describe a model: a named model, a checkpoint directory or hf:org/name (reads its
    config, not its weights); for a training run's folder (zoo train --out), the run too; for
    a LoRA adapter, its base, rank, alpha, targets, parameters and size on disk."""
    from pathlib import Path

    from ..checkpoint.readers import model_folder
    from ..train.report import is_run_folder

    run = Path(args.name) if is_run_folder(Path(args.name)) else None
    if run is not None and model_folder(run) == run and not (run / "adapter").is_dir():
        print(f"{args.name}: a training run (no model saved yet)")
        return _print_run(run)
    info = api.info(args.name)
    print(f"{info.name}: {printable(info.description)}")
    if info.adapter is not None:
        _print_adapter(info.adapter)
        if info.architecture != "-":  # a base zoo can describe without its weights
            print("  base model:")
            _print_model(info)
    else:
        _print_model(info)
    return _print_run(run) if run is not None else 0


def _print_model(info: api.ModelInfo) -> None:
    """The model's rows of ``zoo info``: what it is made of, its weights and config."""
    fields = [
        ("aliases", ", ".join(info.aliases) or "-"),
        ("architecture", f"{info.architecture} ({info.architecture_description})"),
        ("supplied by", info.plugin),
        ("defined in", info.model_source),
        ("blocks", "; ".join(info.blocks) or "-"),
        *((kind, f"{name} (from {source})") for kind, name, source in info.components),
        ("tokenizer", tokenizer_line(info)),
        ("parameters", f"{info.parameters:,}"),
        (
            "weights",
            info.checkpoint or (str(info.weights) if info.weights else "none (random init only)"),
        ),
    ]
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        print(f"  {key.ljust(width)}  {printable(value)}")
    print("  config:")
    for key, value in info.config.items():
        print(f"    {key} = {value!r}")


def _print_adapter(adapter: api.AdapterInfo) -> None:
    """The adapter's rows of ``zoo info ADAPTER``: its base, shape and size."""
    size = adapter.size
    rows = [
        ("base", adapter.base_name or "-"),
        ("base repo", adapter.base_repo or "-"),
        ("base revision", adapter.base_revision or "-"),
        ("base sha256", adapter.base_sha256 or "not recorded (zoo cannot check the base)"),
        ("rank", str(adapter.rank) if adapter.rank is not None else "-"),
        ("alpha", f"{adapter.alpha:g}" if adapter.alpha is not None else "-"),
        ("targets", ", ".join(adapter.targets) or "-"),
        ("parameters", f"{adapter.parameters:,}"),
        ("size on disk", f"{size:,} bytes ({size / 2**20:.2f} MiB)"),
        ("folder", adapter.directory),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key.ljust(width)}  {printable(value)}")


def _print_run(folder: Path) -> int:
    """The ``run:`` section of ``zoo info RUN_FOLDER``."""
    from ..train.report import run_summary

    rows = run_summary(folder)
    width = max(len(k) for k, _ in rows)
    print("  run:")
    for key, value in rows:
        print(f"    {key.ljust(width)}  {printable(value)}")
    return 0


_PLURALS = {
    "architecture": "architectures",
    "model": "models",
    "tokenizer": "tokenizers",
    "positions": "position schemes",
    "norm": "norms",
    "ffn": "feed-forwards",
    "attention": "attention",
}


def cmd_plugins(args: argparse.Namespace) -> int:
    """Print every plugin, its status and what it supplies (importing each architecture, so
    that one whose module fails to import shows as failed)."""
    registry = get_registry()
    registry.verify_architectures()
    rows = [_plugin_row(registry, plugin) for plugin in registry.plugins]
    for path, reason in registry.problems:
        rows.append((path, "failed", "registry file", reason))
    print(table(rows, ("plugin", "status", "distribution", "supplies / reason")))
    _print_plugin_notes(registry)
    return 0


def _plugin_row(registry: Registry, plugin: PluginInfo) -> tuple[str, str, str, str]:
    """A plugin's row of ``zoo plugins``: name, status, distribution, what it supplies (or why
    it failed)."""
    source = f"plugin {plugin.name}"
    supplied = registry.supplied_by(source)
    what = "; ".join(
        f"{_PLURALS.get(kind, kind)}: {', '.join(names)}"
        for kind, names in supplied.items()
        if names
    )
    detail = what if plugin.status == "ok" else plugin.error or ""
    status: str = plugin.status
    contested = registry.conflicts_of(source)
    if status == "ok" and contested:
        status = "conflict"
        detail = f"in conflict on {', '.join(contested)}; {detail}"
    return (plugin.name, status, plugin.distribution or "-", detail)


def _print_plugin_notes(registry: Registry) -> None:
    """The lines under ``zoo plugins``' table: conflicts, layouts that failed to import and
    the choices ``ZOO_PREFER`` made."""
    from ..checkpoint.readers import model_type_conflicts

    for kind, name in registry.unresolved():
        print(f"conflict: {printable(registry.conflict_message(kind, name))}")
    messages, broken = model_type_conflicts()
    for message in messages:
        print(f"conflict: {printable(message)}")
    for what, why in sorted(broken.items()):
        print(printable(f"failed: {what} cannot be imported: {why}"))
    for what, (chosen, sources) in registry.preferred.items():
        others = " and ".join(s for s in sources if s != chosen)
        print(printable(f"preferred: {what} from {chosen} (ZOO_PREFER), over {others}"))


def cmd_check(args: argparse.Namespace) -> int:
    """Run the conformance kit on named models and checkpoints (their architecture and
    config: :mod:`zoo.cli.checked`). Exits 1 on a failed check, and on a skipped one unless
    ``--allow-skip``: a check that could not run proved nothing."""
    from ..testing import run_conformance

    failed, skips = 0, []
    for source in args.names:  # each known or found: _check_names said so, before torch
        for r in run_conformance(checked_name(source), devices=args.device or None):
            failed += r.failed
            status = {"ok": "ok", "failed": "FAILED", "skipped": "SKIPPED"}[r.status]
            line = f"{source:24} {r.check:22} {r.device:5} {status:7} {r.seconds:6.2f}s"
            detail = r.error if r.failed else r.reason
            print(printable(line + (f"  {detail}" if detail else "")))
            if r.skipped:
                skips.append(f"  {source} {r.check} ({r.device}): {r.reason}")
    summary = f"{failed} failed" if failed else "all checks that ran passed"
    if not skips:
        print("all checks passed" if not failed else summary)
        return 1 if failed else 0
    allowed = " (allowed by --allow-skip)"
    if not args.allow_skip:
        allowed = "; a skipped check proved nothing: exit status 1 (--allow-skip accepts skips)"
    print(printable(f"{summary}, {len(skips)} skipped{allowed}:"))
    print(printable("\n".join(skips)))
    return 1 if failed or not args.allow_skip else 0


def _check_names(args: argparse.Namespace) -> None:
    check_sources(args.names)


#: The largest float32 model ``zoo tour`` builds with real weights (MiB); a larger one is
#: built on the meta device (shapes, no memory) so the tour fits in about 1 GB.
TOUR_MAX_MIB = 512


def cmd_tour(args: argparse.Namespace) -> int:
    """Build every named model, run a forward pass, and print what it is made of (one model at
    a time, as each finishes; a model that fails is reported and the tour goes on; the exit
    code is 1 when any failed). Models over --max-mib of float32 weights are built on the
    meta device: their parameter count and output shape, no numbers."""
    conflict_notes()  # a model hidden by a conflict is named on stderr, not skipped silently
    failed, on_meta = [], []
    names = api.list_models()
    for name in names:
        try:
            if _tour_one(name, args.device, args.max_mib):
                on_meta.append(name)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one broken model (or plugin) does not end the tour
            failed.append(name)
            print(f"{name}: FAILED: {printable(exc)}", flush=True)
            print(flush=True)
    built = len(names) - len(failed) - len(on_meta)
    print(f"{built} of {len(names)} named models built on {args.device}", end="")
    if on_meta:
        print(
            f"; {len(on_meta)} over --max-mib {args.max_mib:g} of float32 weights built on the "
            f"meta device (shapes only): {', '.join(on_meta)}",
            end="",
        )
    print(flush=True)
    if failed:
        print(f"zoo: {len(failed)} model(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _tour_one(name: str, device: str, max_mib: float) -> bool:
    """Build ``name``, run one forward pass, and print what it is made of; on the meta device
    when its float32 weights exceed ``max_mib``. True when it was moved there for that."""
    import time

    import torch

    info = api.info(name)
    mib = info.parameters * 4 / 2**20
    if mib > max_mib:
        device = "meta"
    torch.manual_seed(0)
    start = time.perf_counter()
    model = api.build(name, device=device).eval()
    built = time.perf_counter() - start
    inputs = model.example_inputs(batch_size=1, seq_len=16)
    with torch.no_grad():
        start = time.perf_counter()
        logits = model(**inputs)
        forward = time.perf_counter() - start
    if not logits.is_meta and not torch.isfinite(logits).all():
        raise ZooError(f"{name}: forward produced non-finite logits")
    print(f"{name}: {printable(info.description)}")
    fields = [
        ("architecture", f"{info.architecture} ({info.plugin})"),
        ("blocks", "; ".join(info.blocks) or "-"),
        ("components", ", ".join(f"{kind} {name}" for kind, name, _ in info.components)),
        ("tokenizer", tokenizer_line(info)),
        ("parameters", f"{info.parameters:,}"),
        ("forward", f"logits {'x'.join(map(str, logits.shape))}"),
        ("time", f"build {built:.1f}s, forward {forward * 1000:.0f}ms"),
    ]
    if logits.is_meta:
        fields[-2:] = [
            ("forward", f"logits {'x'.join(map(str, logits.shape))} (shapes only)"),
            (
                "device",
                f"meta: {mib:,.0f} MiB of float32 weights is over --max-mib {max_mib:g}; "
                f"zoo tour --max-mib {int(mib) + 1} builds it",
            ),
        ]
    for key, value in fields:
        print(f"  {key.ljust(12)}  {printable(value)}")
    print(flush=True)
    return mib > max_mib


def _list_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--all", action="store_true", help="include models whose plugin is missing")


def _info_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name",
        metavar="NAME_OR_SOURCE",
        help="named model or alias, a checkpoint directory, a LoRA adapter folder, or "
        "hf:org/name[@rev]",
    )


def _tour_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="device to build on (default: cpu)")
    p.add_argument(
        "--max-mib",
        type=float,
        default=TOUR_MAX_MIB,
        metavar="MIB",
        help="build larger models (float32 weights, MiB) on the meta device: shapes, no "
        f"memory (default: {TOUR_MAX_MIB})",
    )


def _check_tour(args: argparse.Namespace) -> None:
    from .bounds import check_finite

    check_finite(args.max_mib, "--max-mib")


def _check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "names",
        nargs="+",
        metavar="NAME_OR_SOURCE",
        help="named models, or checkpoints (a folder, a training run's --out, a LoRA adapter "
        "folder, hf:org/name) checked as their architecture and config",
    )
    p.add_argument(
        "--device",
        action="append",
        help="device to check on (repeatable); default: cpu, and cuda when available",
    )
    p.add_argument(
        "--allow-skip",
        action="store_true",
        help="exit 0 when checks were skipped (not run: each is named with why); by default "
        "a skip exits 1, as a failure does",
    )


COMMANDS = {
    "list": Command(cmd_list, _list_arguments),
    "info": Command(cmd_info, _info_arguments),
    "plugins": Command(cmd_plugins),
    "tour": Command(cmd_tour, _tour_arguments, _check_tour),
    "check": Command(cmd_check, _check_arguments, _check_names),
}
