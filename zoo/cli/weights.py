"""``zoo pull``, ``push``, ``convert`` and ``merge``: checkpoints (and LoRA adapters) to and
from the Hugging Face Hub, between layouts, and an adapter folded into its base."""

from __future__ import annotations

import argparse
import sys

from ..options import GGUF_TYPES
from .parser import Command

__all__ = ["COMMANDS"]


def cmd_push(args: argparse.Namespace) -> int:
    """Publish a checkpoint directory (written by zoo.save, or a training run's folder) or a
    LoRA adapter folder to a Hugging Face Hub repo."""
    from .. import hub

    ref = hub.push(
        args.directory,
        args.repo,
        revision=args.revision,
        private=args.private,
        commit_message=args.message,
        max_shard_size=args.max_shard_size,
    )
    print(f"pushed {args.directory} to {ref.repo_id}@{ref.revision}: commit {ref.sha}")
    print(f"  {ref.url}")
    print(f"  load it with {_load_line(args.directory, ref.source)}")
    return 0


def _load_line(directory: str, source: str) -> str:
    """The Python line that loads what was pushed from ``source``: ``zoo.load(SOURCE)`` for a
    model; for a LoRA adapter (no model of its own), its base with ``adapter=SOURCE``, the
    base as the adapter records it (``BASE`` where it records none)."""
    from pathlib import Path

    from .. import api
    from ..hub.adapter import adapter_folder

    if adapter_folder(Path(directory)) is None:
        return f'zoo.load("{source}")'
    adapter = api.info(directory).adapter
    base = "BASE"
    if adapter is not None and adapter.base_name:
        base = adapter.base_name
    elif adapter is not None and adapter.base_repo:
        revision = f"@{adapter.base_revision}" if adapter.base_revision else ""
        base = f"hf:{adapter.base_repo}{revision}"
    line = f'zoo.load("{base}", adapter="{source}")'
    return line if base != "BASE" else line + "  (BASE: the model it was trained on)"


def _shard_size(text: str) -> int | str:
    """``--max-shard-size``: bytes, or a size such as 5GB / 500MB (checked here)."""
    from ..checkpoint.shards import parse_max_shard_size

    size: int | str = int(text) if text.isdigit() else text
    try:
        parse_max_shard_size(size)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return size


def _add_max_shard_size(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-shard-size",
        type=_shard_size,
        metavar="SIZE",
        help="split the weights into shards of at most SIZE (bytes, or e.g. 5GB, 500MB), "
        "named and indexed as transformers' save_pretrained does (default: one file)",
    )


def cmd_pull(args: argparse.Namespace) -> int:
    """Download a named model's weights or a Hub repo into the Hugging Face cache."""
    from .. import hub

    print(hub.pull(args.name, revision=args.revision))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert a checkpoint between the zoo layout and a Hugging Face layout."""
    from ..loading import convert_checkpoint

    path = convert_checkpoint(
        args.source,
        args.destination,
        to=args.to,
        max_shard_size=args.max_shard_size,
        type=args.type,
    )
    if args.to == "gguf":
        print(f"wrote {path} (GGUF, {args.type or 'f32'}: llama.cpp, ollama and zoo load it)")
        return 0
    print(f"wrote {path} ({args.to} layout)")
    if args.to != "zoo" and (path / "tokenizer.json").is_file():
        print("with its tokenizer (tokenizer.json: transformers.AutoTokenizer loads it)")
    elif args.to != "zoo":
        print(
            f"without a tokenizer: {args.source} has none zoo could write (see any warning "
            "above); give transformers the tokenizer separately",
            file=sys.stderr,
        )
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    """Fold a LoRA adapter into its base model's weights and write the result as a plain
    checkpoint (the base's own format, with its tokenizer and chat template)."""
    from ..loading import merge_to

    path, layout = merge_to(args.base, args.adapter, args.destination, to=args.to)
    shown = "zoo" if layout == "zoo" else "Hugging Face"
    print(f"wrote {path}: {args.base} with {args.adapter} merged ({shown} layout)")
    return 0


def _check_merge(args: argparse.Namespace) -> None:
    from .. import loading

    loading.check_source(args.base)
    loading.check_adapter(args.adapter)


def _merge_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "base", metavar="BASE", help="the base: a named model, hf:org/name[@rev] or a directory"
    )
    p.add_argument(
        "adapter",
        metavar="ADAPTER",
        help="the LoRA adapter: a folder with adapter_config.json, a LoRA run's folder, or "
        "hf:org/name[@rev]; it must record BASE",
    )
    p.add_argument("destination", metavar="OUT", help="directory to write (atomically)")
    p.add_argument(
        "--to",
        default=None,
        help="layout to write: zoo, or a Hugging Face one such as hf-gpt2 (default: the base's)",
    )


def _check_convert(args: argparse.Namespace) -> None:
    from .. import loading

    loading.check_source(args.source)


def _convert_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        help="a zoo checkpoint directory, a Hugging Face one, a GGUF file, or a LoRA adapter "
        "or run (merged into its base)",
    )
    p.add_argument("destination", help="directory (or with --to gguf, file) to write atomically")
    p.add_argument(
        "--to",
        default="zoo",
        help="target layout: zoo (default), a Hugging Face layout (hf-gpt2, hf-llama, ...) or gguf",
    )
    p.add_argument(
        "--type",
        choices=GGUF_TYPES,
        help="with --to gguf: the tensors' type (default f32)",
    )
    _add_max_shard_size(p)


def _push_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "directory",
        metavar="DIR",
        help="a checkpoint directory written by zoo.save or zoo convert, a training run's "
        "folder (zoo train --out), or a LoRA adapter folder (published with a card naming its "
        "base)",
    )
    p.add_argument("repo", metavar="REPO", help="Hub repo id, org/name")
    p.add_argument("--revision", help="branch to commit to (default: the main branch)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--message", help="commit message")
    _add_max_shard_size(p)


def _pull_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name", metavar="NAME_OR_REPO", help="a named model with Hub weights, or org/name[@rev]"
    )
    p.add_argument("--revision", help="branch, tag or commit sha")


COMMANDS = {
    "convert": Command(cmd_convert, _convert_arguments, _check_convert),
    "push": Command(cmd_push, _push_arguments),
    "pull": Command(cmd_pull, _pull_arguments),
    "merge": Command(cmd_merge, _merge_arguments, _check_merge),
}
