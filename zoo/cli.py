"""The ``zoo`` command line.

Every command answers ``--help``; an error is one line on stderr and a non-zero exit code.
Listing commands never import torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import api
from .errors import ZooError
from .options import GENERATION_DEFAULTS, MAX_DISTINCT_BYTES, QUANTIZE_MODE_HELP, QUANTIZE_MODES
from .plugin.registry import get_registry

if TYPE_CHECKING:
    from pathlib import Path

    from .generation import GenerationConfig
    from .nn.base import ZooModel
    from .tokenizers import Tokenizer
    from .train import TrainConfig

__all__ = ["main"]


#: Unicode categories never printed raw: controls (terminal escape sequences start with ESC),
#: format characters (bidirectional overrides), surrogates, private-use and unassigned code
#: points, line and paragraph separators.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _printable(text: object) -> str:
    """``text`` as one line a terminal shows as written: every control or format character
    (``ESC`` of a terminal escape code, a newline, a bidirectional override) is spelled as an
    escape (``\\x1b``). Everything a plugin or registry file supplies is printed through this."""
    import unicodedata

    return "".join(
        (
            f"\\x{ord(c):02x}"
            if ord(c) < 0x100
            else f"\\u{ord(c):04x}"
            if ord(c) < 0x10000
            else f"\\U{ord(c):08x}"
        )
        if unicodedata.category(c) in _UNPRINTABLE
        else c
        for c in str(text)
    )


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    rows = [[_printable(c) for c in row] for row in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _conflict_notes() -> list[tuple[str, str]]:
    """``(name, "conflict: A vs B")`` for each named model made unusable by a conflict (on its
    own name or on its architecture), with a note on stderr saying how to resolve each."""
    registry = get_registry()
    conflicts = registry.unresolved()
    rows = []
    for (kind, name), sources in conflicts.items():
        print(f"zoo: {_printable(registry.conflict_message(kind, name))}", file=sys.stderr)
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
    rows += [(name, "-", "", "", note) for name, note in _conflict_notes()]
    print(_table(sorted(rows), ("model", "architecture", "aliases", "weights", "description")))
    _problem_notes()
    return 0


def _problem_notes() -> None:
    """Name each registry file that was skipped, and why, on stderr (its models are missing
    from the listing; everything else is there)."""
    for path, reason in get_registry().problems:
        print(
            f"zoo: skipped registry file {_printable(path)}: {_printable(reason)}", file=sys.stderr
        )


def _tokenizer_line(info: api.ModelInfo) -> str:
    if info.tokenizer is None:
        return "-"
    if info.tokenizer_description:
        return f"{info.tokenizer} ({info.tokenizer_description})"
    return info.tokenizer


def cmd_info(args: argparse.Namespace) -> int:
    """Describe a model: a named model, a checkpoint directory or hf:org/name (reads its
    config, not its weights); for a training run's folder (zoo train --out), the run too."""
    from pathlib import Path

    from .checkpoint.readers import model_folder
    from .train.report import is_run_folder

    run = Path(args.name) if is_run_folder(Path(args.name)) else None
    if run is not None and model_folder(run) == run:  # no checkpoint written yet
        print(f"{args.name}: a training run (no model saved yet)")
        return _print_run(run)
    info = api.info(args.name)
    print(f"{info.name}: {_printable(info.description)}")
    fields = [
        ("aliases", ", ".join(info.aliases) or "-"),
        ("architecture", f"{info.architecture} ({info.architecture_description})"),
        ("supplied by", info.plugin),
        ("defined in", info.model_source),
        ("blocks", "; ".join(info.blocks) or "-"),
        *((kind, f"{name} (from {source})") for kind, name, source in info.components),
        ("tokenizer", _tokenizer_line(info)),
        ("parameters", f"{info.parameters:,}"),
        (
            "weights",
            info.checkpoint or (str(info.weights) if info.weights else "none (random init only)"),
        ),
    ]
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        print(f"  {key.ljust(width)}  {_printable(value)}")
    print("  config:")
    for key, value in info.config.items():
        print(f"    {key} = {value!r}")
    return _print_run(run) if run is not None else 0


def _print_run(folder: Path) -> int:
    """The ``run:`` section of ``zoo info RUN_FOLDER``."""
    from .train.report import run_summary

    rows = run_summary(folder)
    width = max(len(k) for k, _ in rows)
    print("  run:")
    for key, value in rows:
        print(f"    {key.ljust(width)}  {_printable(value)}")
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
    rows = []
    for plugin in registry.plugins:
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
        rows.append((plugin.name, status, plugin.distribution or "-", detail))
    for path, reason in registry.problems:
        rows.append((path, "failed", "registry file", reason))
    print(_table(rows, ("plugin", "status", "distribution", "supplies / reason")))
    for kind, name in registry.unresolved():
        print(f"conflict: {_printable(registry.conflict_message(kind, name))}")
    from .checkpoint.readers import model_type_conflicts

    messages, broken = model_type_conflicts()
    for message in messages:
        print(f"conflict: {_printable(message)}")
    for what, why in sorted(broken.items()):
        print(_printable(f"failed: {what} cannot be imported: {why}"))
    for what, (chosen, sources) in registry.preferred.items():
        others = " and ".join(s for s in sources if s != chosen)
        print(_printable(f"preferred: {what} from {chosen} (ZOO_PREFER), over {others}"))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Run the conformance kit on named models."""
    from .testing import run_conformance

    failed = skipped = 0
    for name in args.names:  # each name known: _check_names said so, before torch
        for r in run_conformance(name, devices=args.device or None):
            failed += r.failed
            skipped += r.skipped
            status = {"ok": "ok", "failed": "FAILED", "skipped": "SKIPPED"}[r.status]
            line = f"{r.model:24} {r.check:22} {r.device:5} {status:7} {r.seconds:6.2f}s"
            detail = r.error if r.failed else r.reason
            print(_printable(line + (f"  {detail}" if detail else "")))
    passed = "all checks that ran passed" if skipped else "all checks passed"
    summary = f"{failed} failed" if failed else passed
    print(summary + (f", {skipped} skipped (not checked; see why above)" if skipped else ""))
    return 1 if failed else 0


#: The largest float32 model ``zoo tour`` builds with real weights (MiB); a larger one is
#: built on the meta device (shapes, no memory) so the tour fits in about 1 GB.
TOUR_MAX_MIB = 512


def cmd_tour(args: argparse.Namespace) -> int:
    """Build every named model, run a forward pass, and print what it is made of (one model at
    a time, as each finishes; a model that fails is reported and the tour goes on; the exit
    code is 1 when any failed). Models over --max-mib of float32 weights are built on the
    meta device: their parameter count and output shape, no numbers."""
    _conflict_notes()  # a model hidden by a conflict is named on stderr, not skipped silently
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
            print(f"{name}: FAILED: {_printable(exc)}", flush=True)
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
    print(f"{name}: {_printable(info.description)}")
    fields = [
        ("architecture", f"{info.architecture} ({info.plugin})"),
        ("blocks", "; ".join(info.blocks) or "-"),
        ("components", ", ".join(f"{kind} {name}" for kind, name, _ in info.components)),
        ("tokenizer", _tokenizer_line(info)),
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
        print(f"  {key.ljust(12)}  {_printable(value)}")
    print(flush=True)
    return mib > max_mib


def cmd_push(args: argparse.Namespace) -> int:
    """Publish a checkpoint directory (written by zoo.save, or a training run's folder) to a
    Hugging Face Hub repo."""
    from . import hub

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
    print(f'  load it with zoo.load("{ref.source}")')
    return 0


def _shard_size(text: str) -> int | str:
    """``--max-shard-size``: bytes, or a size such as 5GB / 500MB (checked here)."""
    from .checkpoint.shards import parse_max_shard_size

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
    from . import hub

    print(hub.pull(args.name, revision=args.revision))
    return 0


_DTYPES = ("float32", "bfloat16", "float16")


def _load_for_generation(args: argparse.Namespace) -> ZooModel:
    import torch

    from . import loading

    dtype = getattr(torch, args.dtype) if args.dtype else None
    if args.random:
        if args.seed is not None:
            torch.manual_seed(args.seed)  # the random weights too: --seed makes runs identical
        model = api.build(args.source, device=args.device, dtype=dtype).eval()
        if args.quantize:
            from .nn.quant import quantize_

            with torch.no_grad():
                quantize_(model, args.quantize)
        return model
    return loading.load(args.source, device=args.device, dtype=dtype, quantize=args.quantize)


def _generation_config(args: argparse.Namespace, stop: tuple[str, ...] = ()) -> GenerationConfig:
    """The sampling flags of ``zoo generate`` and ``zoo chat`` as a :class:`GenerationConfig`:
    every setting checked before anything is loaded or seeded."""
    from .generation import GenerationConfig

    return GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=stop,
        compile=args.compile,
    )


def _given_tokenizer(args: argparse.Namespace) -> Tokenizer | None:
    """The tokenizer ``--tokenizer`` names, or ``None``: the model's own."""
    return api.tokenizer(args.tokenizer) if args.tokenizer else None


def _check_utf8(text: str, what: str) -> None:
    """Python hands over argument bytes that are not UTF-8 as lone surrogates U+DC80..U+DCFF
    (``surrogateescape``); say which byte, before anything is loaded."""
    for i, char in enumerate(text):
        if 0xDC80 <= ord(char) <= 0xDCFF:
            raise ValueError(
                f"{what} is not valid UTF-8: byte 0x{ord(char) - 0xDC00:02x} at character {i}; "
                "pass UTF-8 text (check the terminal's encoding, e.g. LANG=C.UTF-8)"
            )


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate text from a prompt, streaming it to the terminal."""
    from .generation import stream_text

    config = _generate_config(args)
    model = _load_for_generation(args)
    tokenizer = _given_tokenizer(args)
    # the tokenizer and the prompt are checked here, before anything is printed
    pieces = stream_text(model, args.prompt, config, tokenizer=tokenizer)
    print(args.prompt, end="", flush=True)
    _print_pieces(pieces)
    return 0


def _generate_config(args: argparse.Namespace) -> GenerationConfig:
    """``zoo generate``'s prompt, stop strings and sampling flags, checked (no torch)."""
    _check_utf8(args.prompt, "the prompt")
    for stop in args.stop or ():
        _check_utf8(stop, "a --stop string")
    return _generation_config(args, stop=tuple(args.stop or ()))


def _print_pieces(pieces: Iterable[str]) -> str:
    """Print ``pieces`` as they arrive, then end the line (on an error too, so that it is
    printed on a line of its own); returns the text printed."""
    printed = []
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
            printed.append(piece)
    finally:
        print(flush=True)
    return "".join(printed)


#: The longest reply ``zoo chat`` generates by default (``--max-new-tokens``).
CHAT_MAX_NEW_TOKENS = 512


def cmd_chat(args: argparse.Namespace) -> int:
    """Chat with an instruct model: each line you type is a message, the reply streams back.
    The whole conversation goes through the model's chat template every turn; /reset starts
    over, /exit or end of input quits."""
    from .generation.text import resolve_tokenizer
    from .tokenizers import ChatTemplateError

    config = _chat_config(args)
    model = _load_for_generation(args)
    tokenizer = resolve_tokenizer(model, _given_tokenizer(args), "zoo chat")
    if tokenizer.chat_template is None:
        raise ChatTemplateError(
            f"{args.source} has no chat template: its tokenizer ({tokenizer.name}) defines none "
            "(no chat_template in tokenizer_config.json, no chat_template.jinja). zoo chat "
            "needs an instruct model's; continue plain text with `zoo generate`, or give a "
            "tokenizer folder that has one with --tokenizer DIR"
        )
    opening = [] if args.system is None else [{"role": "system", "content": args.system}]
    history = list(opening)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"zoo chat with {args.source}: /reset starts over, /exit quits", file=sys.stderr)
    for line in _input_lines(interactive):
        text = line.strip()
        if text == "/exit":
            break
        if text == "/reset":
            history = list(opening)
            print("(conversation cleared)", file=sys.stderr, flush=True)
            continue
        if text:
            history = _chat_turn(model, tokenizer, config, history, line)
    return 0


def _chat_config(args: argparse.Namespace) -> GenerationConfig:
    """``zoo chat``'s system message and sampling flags, checked (no torch)."""
    if args.system is not None:
        _check_utf8(args.system, "--system")
    return _generation_config(args)


def _input_lines(prompt: bool) -> Iterator[str]:
    """The lines of standard input, decoded as UTF-8 (a byte that is not becomes U+FFFD),
    without their line ends; ``> `` before each on a terminal."""
    stream = getattr(sys.stdin, "buffer", None)
    while True:
        if prompt:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = stream.readline() if stream is not None else sys.stdin.readline()
        if not raw:
            return
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        yield line.rstrip("\r\n")


def _chat_turn(
    model: ZooModel,
    tokenizer: Tokenizer,
    config: GenerationConfig,
    history: list[dict[str, str]],
    message: str,
) -> list[dict[str, str]]:
    """Send ``message`` after ``history``, stream the reply to stdout, and return the
    conversation with both; a turn the template or the model refuses (a conversation too
    long for the context) is reported and left out."""
    from .generation import stream_continuation

    turn = [*history, {"role": "user", "content": message}]
    try:
        ids = tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=True)
        pieces = stream_continuation(model, ids, config, tokenizer=tokenizer)
    except ValueError as exc:  # ChatTemplateError, or a prompt the context cannot hold
        print(f"zoo: error: {_printable(exc)} (/reset starts over)", file=sys.stderr)
        return history
    return [*turn, {"role": "assistant", "content": _print_pieces(pieces)}]


def cmd_classify(args: argparse.Namespace) -> int:
    """Label texts with a sequence classifier (a checkpoint saved by `zoo train --task
    classify`): prints each text's label, its probability and the text, tab-separated."""
    import torch

    from . import loading

    model = loading.load(args.checkpoint, device=args.device)
    labels = getattr(model.config, "labels", None)
    if not isinstance(labels, list):
        raise ValueError(
            f"{args.checkpoint} is a {type(model).__name__} ({type(model.config).architecture}), "
            "not a sequence classifier: it has no labels. Continue text with `zoo generate`; "
            "train a classifier with `zoo train --task classify`"
        )
    tokenizer = api.tokenizer(args.tokenizer) if args.tokenizer else model.tokenizer
    if tokenizer is None:
        raise ValueError(
            f"{args.checkpoint} was loaded without a tokenizer "
            f"({model.tokenizer_error or 'none was saved with it'}); pass --tokenizer NAME"
        )
    device = next(model.parameters()).device
    for i, text in enumerate(args.texts):
        ids = tokenizer.encode(text)
        if not ids:
            raise ValueError(f"text {i + 1} is empty: give some text to classify")
        with torch.inference_mode():
            logits = model(torch.tensor([ids], device=device))  # (1, n_labels)
        probs = logits.float().softmax(dim=-1)[0]
        best = int(probs.argmax())
        print(f"{labels[best]}\t{float(probs[best]):.4f}\t{text}", flush=True)
    return 0


def _override(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line; the value parsed as JSON when it can be."""
    import json

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set takes key=value, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def cmd_train(args: argparse.Namespace) -> int:
    """Train a model (new, or fine-tune weights with --from) on text, pairs or labelled text;
    works under torchrun. Exit status: 0 when done, 2 on an error (a diverged run included),
    130/143 after SIGINT/SIGTERM (checkpoint saved: the same command resumes)."""
    import torch

    from . import loading
    from .devices import check_computes
    from .train import classifier, labels_in, train, train_tokenizer

    # before anything is loaded: the checks zoo generate makes (the meta device included)
    check_computes(api.check_device(args.device), None, "train", "zoo train --device cpu")
    config = _train_config(args)  # its errors too, before a model is built or a tokenizer trained
    overrides = dict(_override(item) for item in args.set or ())
    tok = None
    if args.tokenizer is not None:
        from .tokenizers import load_directory

        tok = load_directory(args.tokenizer)
    elif args.train_tokenizer is not None:  # with a new model: _check_train said so
        tok = train_tokenizer(
            args.data, args.train_tokenizer, args.tokenizer_max_distinct or MAX_DISTINCT_BYTES
        )
        overrides.setdefault("vocab_size", tok.vocab_size)
    if args.source is None:
        torch.manual_seed(args.seed)
        model = api.build(args.model, **overrides)
    else:  # without --set: _check_train said so
        model = loading.load(args.source)
    if args.task == "classify":  # a linear head over the labels the data uses
        model = classifier(model, labels_in(args.data))
    result = train(
        model,
        args.data,
        args.out,
        config=config,
        tokenizer=tok,
        device=args.device,
        strategy=args.strategy,
    )
    if result.val_loss is not None:
        print(f"val loss {result.val_loss:.4f} after {result.steps} steps")
    print(f"model: {result.checkpoint}")
    return 128 + result.signal if result.signal else 0  # 130 (SIGINT), 143 (SIGTERM)


def _train_config(args: argparse.Namespace) -> TrainConfig:
    """``zoo train``'s training flags as a checked :class:`~zoo.train.TrainConfig` (no torch)."""
    from .train import TrainConfig

    return TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        lr=args.lr,
        min_lr=args.min_lr if args.min_lr is not None else args.lr / 10,
        warmup=args.warmup,
        eval_every=args.eval_every,
        eval_batches=args.eval_batches,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        time_budget=args.time_budget,
        loss_target=args.loss_target,
        bf16=args.bf16,
    )


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert a checkpoint between the zoo layout and a Hugging Face layout."""
    from .loading import convert_checkpoint

    path = convert_checkpoint(
        args.source, args.destination, to=args.to, max_shard_size=args.max_shard_size
    )
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


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a model over the OpenAI HTTP API (/v1/completions, /v1/chat/completions,
    /v1/models) with continuous batching, until Ctrl+C or SIGTERM (which lets the requests
    in flight finish)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ZooError(
            f"zoo serve needs FastAPI and uvicorn ({exc}): pip install 'torch-zoo[serve]'"
        ) from None
    from .generation.text import resolve_tokenizer
    from .nn.slots import check_batchable
    from .settings import Settings

    api_key = args.api_key if args.api_key is not None else Settings.from_env().api_key
    model = _load_for_generation(args)
    check_batchable(model)
    tokenizer = resolve_tokenizer(model, _given_tokenizer(args), "zoo serve")
    from .serve import serve
    from .serve.server import LOOPBACK

    if args.host not in LOOPBACK and not api_key:
        print(
            f"zoo: warning: serving on {args.host} without an API key: anyone who reaches "
            "this port can use the model (set ZOO_API_KEY or --api-key)",
            file=sys.stderr,
        )
    serve(
        model,  # type: ignore[arg-type]  # a DecoderLM: check_batchable said so
        tokenizer,
        model_id=args.served_model_name or args.source,
        host=args.host,
        port=args.port,
        api_key=api_key,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_len=args.max_model_len,
        max_body_bytes=args.max_body_bytes,
        drain_timeout=args.drain_timeout,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keep_alive=args.keep_alive,
        max_connections=args.max_connections,
        log_level=args.log_level,
    )
    return 0


def _add_serve(p: argparse.ArgumentParser) -> None:
    """The arguments of ``zoo serve``."""
    p.add_argument(
        "source",
        metavar="NAME_OR_SOURCE",
        help="named model (official weights), hf:org/name[@rev], or a directory",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (default: 8000)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every request (default: ZOO_API_KEY, "
        "else none; prefer the variable: a command line is visible to other users)",
    )
    p.add_argument(
        "--served-model-name",
        metavar="NAME",
        default=None,
        help="the model name clients send (default: NAME_OR_SOURCE as given)",
    )
    p.add_argument(
        "--max-batch",
        type=_positive,
        default=8,
        help="sequences decoding together; requests join between steps (default: 8)",
    )
    p.add_argument(
        "--max-queue",
        type=_non_negative,
        default=64,
        help="sequences waiting for a free slot; beyond it requests get 429 (default: 64)",
    )
    p.add_argument(
        "--max-model-len",
        type=_positive,
        default=None,
        help="prompt plus new tokens per sequence (the cache's length; default: the context)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=_positive,
        default=4 * 2**20,
        help="larger request bodies get 413 (default: 4 MiB)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds the requests in flight may take to finish after SIGTERM (default: 60)",
    )
    p.add_argument(
        "--header-timeout",
        type=_seconds,
        default=10.0,
        help="seconds a client may take to send a request's headers; then 408 (default: 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=_seconds,
        default=30.0,
        help="seconds a client may take to send a request's body after its headers; then 408 "
        "(default: 30)",
    )
    p.add_argument(
        "--keep-alive",
        type=_seconds,
        default=5.0,
        help="seconds an idle connection stays open between requests (default: 5)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive,
        default=None,
        help="connections open at once; beyond it the one idle longest is closed, or 503 when "
        "every one has a request in progress (default: 1024, or less to stay under ulimit -n)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="uvicorn's; warning drops the line per request (default: info)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="NAME",
        default=None,
        help="a named model's or a registered tokenizer's name (default: the model's own)",
    )
    _add_model_loading(p, compile=False)  # the batched step is not compiled
    p.add_argument("--seed", type=int, default=None, help="the random weights' seed (--random)")


def _add_sampling(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    """``--max-new-tokens``, ``--temperature``, ``--top-k``, ``--top-p`` and ``--seed``
    (``zoo generate``'s and ``zoo chat``'s); the defaults are ``zoo.generate``'s, so the same
    seed gives the same text."""
    defaults = GENERATION_DEFAULTS
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=max_new_tokens,
        help=f"default: {max_new_tokens}",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=defaults.temperature,
        help=f"0 = greedy (default: {defaults.temperature})",
    )
    p.add_argument("--top-k", type=int, default=defaults.top_k, help="default: no filter")
    p.add_argument("--top-p", type=float, default=defaults.top_p, help="default: no filter")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="makes sampling reproducible: an integer from 0 to 2**64 - 1 (as zoo.generate's "
        "seed=)",
    )


def _add_model_loading(p: argparse.ArgumentParser, *, compile: bool = True) -> None:
    """``--device``, ``--dtype``, ``--quantize``, ``--compile`` (unless ``compile`` is false)
    and ``--random``: how :func:`_load_for_generation` loads the model."""
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")
    p.add_argument("--dtype", choices=_DTYPES, default=None, help="default: as stored")
    p.add_argument(
        "--quantize",
        choices=QUANTIZE_MODES,
        default=None,
        help="quantize the linear layers while loading (default: none): "
        + "; ".join(f"{mode}: {what}" for mode, what in QUANTIZE_MODE_HELP.items()),
    )
    if compile:
        p.add_argument(
            "--compile",
            action="store_true",
            help="compile the decoding step with torch.compile (CPU; needs a C++ compiler; the "
            "first run compiles for a while, later ones reuse torch's cache)",
        )
    p.add_argument(
        "--random",
        action="store_true",
        help="use a randomly initialised named model (no weights, works offline)",
    )


def _add_chat(p: argparse.ArgumentParser) -> None:
    """The arguments of ``zoo chat``."""
    p.add_argument(
        "source",
        metavar="NAME_OR_SOURCE",
        help="an instruct model with a chat template: a named model, hf:org/name[@rev], or a "
        "directory",
    )
    p.add_argument(
        "--system",
        metavar="TEXT",
        default=None,
        help="a system message that opens the conversation (default: none, the template's)",
    )
    _add_sampling(p, CHAT_MAX_NEW_TOKENS)
    p.add_argument(
        "--tokenizer",
        metavar="NAME_OR_DIR",
        default=None,
        help="the tokenizer (and its chat template) to use: a named model's or a registered "
        "tokenizer's name, or a tokenizer folder (default: the model's own)",
    )
    _add_model_loading(p)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):  # not NaN either
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _did_you_mean(given: str, known: Sequence[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``known`` to ``given``, or ``""``."""
    import difflib

    close = difflib.get_close_matches(given, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class _Parser(argparse.ArgumentParser):
    """An argument parser that suggests the closest valid spelling: of a command or a choice
    (``zoo generat``, ``--quantize int9``) and of an option the command does not have
    (``zoo generate ... --max-tokens 10``), which it reports with that command's usage, not
    the top level's. (Python 3.14's ``suggest_on_error`` covers choices only.)"""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and isinstance(value, str) and value not in choices:
            names = [str(c) for c in choices]
            hint = _did_you_mean(value, names)
            if hint:
                raise argparse.ArgumentError(
                    action,
                    f"invalid choice: {value!r}{hint}; choose from {', '.join(names)}",
                )
        super()._check_value(action, value)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._command_parser(getattr(parsed, "command", None)) or self
            options = [o for a in parser._actions for o in a.option_strings]
            hints = "".join(
                _did_you_mean(x.partition("=")[0], options) for x in extras if x.startswith("-")
            )
            parser.error(f"unrecognized arguments: {' '.join(extras)}{hints}")
        return parsed

    def _command_parser(self, command: str | None) -> argparse.ArgumentParser | None:
        """The subcommand's own parser (its usage is the one to show)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                return action.choices[command]
        return None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``zoo`` command."""
    parser = _Parser(prog="zoo", description="A plugin-based model zoo for PyTorch.")
    parser.add_argument("--version", action="version", version=f"zoo {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        doc = (func.__doc__ or "").strip()
        p = sub.add_parser(name, help=doc, description=doc)
        p.set_defaults(func=func)
        return p

    p = add("list", cmd_list)
    p.add_argument("--all", action="store_true", help="include models whose plugin is missing")
    add("info", cmd_info).add_argument(
        "name",
        metavar="NAME_OR_SOURCE",
        help="named model or alias, a checkpoint directory, or hf:org/name[@rev]",
    )
    add("plugins", cmd_plugins)
    p = add("tour", cmd_tour)
    p.add_argument("--device", default="cpu", help="device to build on (default: cpu)")
    p.add_argument(
        "--max-mib",
        type=float,
        default=TOUR_MAX_MIB,
        metavar="MIB",
        help="build larger models (float32 weights, MiB) on the meta device: shapes, no "
        f"memory (default: {TOUR_MAX_MIB})",
    )
    p = add("generate", cmd_generate)
    p.add_argument(
        "source",
        metavar="NAME_OR_SOURCE",
        help="named model (official weights), hf:org/name[@rev], or a directory",
    )
    p.add_argument("prompt", help="the text to continue")
    _add_sampling(p, GENERATION_DEFAULTS.max_new_tokens)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument(
        "--tokenizer",
        metavar="NAME",
        default=None,
        help="the tokenizer to use: a named model's or a registered tokenizer's name "
        "(default: the one saved with the checkpoint or declared by its named model)",
    )
    _add_model_loading(p)
    _add_chat(add("chat", cmd_chat))
    p = add("classify", cmd_classify)
    p.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a classifier: a directory written by zoo train --task classify, or hf:org/name",
    )
    p.add_argument("texts", nargs="+", metavar="TEXT", help="the texts to label")
    p.add_argument(
        "--tokenizer",
        metavar="NAME",
        default=None,
        help="a named model's or a registered tokenizer's name (default: the checkpoint's)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")
    p = add("train", cmd_train)
    p.add_argument(
        "model",
        nargs="?",
        metavar="NAME",
        help="a named model to train from random weights (its config, changed by --set)",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="SOURCE",
        help="weights to fine-tune instead: a checkpoint directory, hf:org/name[@rev], or a "
        "named model with weights (gpt2-124m) (default: none, NAME from random weights)",
    )
    p.add_argument(
        "--data",
        required=True,
        help="text (a file or a folder of .txt files); for an encoder-decoder a "
        "source<TAB>target file; with --task classify a text<TAB>label file",
    )
    p.add_argument(
        "--task",
        choices=("lm", "classify"),
        default="lm",
        help="lm: the model's own task; classify: fine-tune it as a sequence classifier (a "
        "linear head on the last token, saved with the checkpoint) (default: lm)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="the run's folder (running again resumes; one run at a time)",
    )
    tokens = p.add_mutually_exclusive_group()
    tokens.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="a saved tokenizer (default: the model's own)",
    )
    tokens.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="VOCAB_SIZE",
        help="first train a byte-level BPE of this many ids on --data (both columns of a "
        "TSV) and size the new model's vocabulary to it; saved with the checkpoint "
        "(default: none)",
    )
    p.add_argument(
        "--tokenizer-max-distinct",
        type=_positive,
        metavar="BYTES",
        help="with --train-tokenizer: learn from the data until its distinct words take this "
        "many bytes, then warn and stop reading; the trainer holds up to ~120 bytes of memory "
        f"per byte of it (default: {MAX_DISTINCT_BYTES:,})",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="change the new model's config, e.g. --set context_length=256 (repeatable; "
        "default: the named model's config)",
    )
    # the defaults are TrainConfig's (tests/test_train_seams.py checks they agree)
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps (default: 1000)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="sequences per step, over all processes, each of the model's context_length "
        "tokens (set with --set context_length=N) (default: 16)",
    )
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default: 1)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument(
        "--min-lr",
        type=float,
        default=None,
        help="where the cosine decay ends (default: lr / 10)",
    )
    p.add_argument("--warmup", type=int, default=100, help="steps of linear warm-up (default: 100)")
    p.add_argument(
        "--eval-every",
        type=int,
        default=200,
        help="steps between held-out evaluations, 0: only at the end (default: 200)",
    )
    p.add_argument(
        "--eval-batches",
        type=int,
        default=20,
        help="held-out batches per evaluation, the same ones each time (default: 20)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="steps between resumable checkpoints, 0: only at the end and on a signal "
        "(default: at every evaluation, i.e. --eval-every)",
    )
    p.add_argument("--seed", type=int, default=0, help="makes the run repeatable (default: 0)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=0.0,
        help="seconds of training, data preparation included; no step is started that "
        "would end past it, with the final evaluation and checkpoint, and a budget that "
        "cannot fit one is refused before it (default: 0, no budget)",
    )
    p.add_argument(
        "--loss-target",
        type=float,
        default=0.0,
        help="stop once the held-out loss is at most this (default: 0, no target)",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cpu)")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="bfloat16 autocast, weights stay float32 (default: off)",
    )
    p.add_argument(
        "--strategy",
        choices=("ddp", "fsdp"),
        default="ddp",
        help="under torchrun: ddp (whole model per process) or fsdp (FSDP2 sharding) "
        "(default: ddp)",
    )
    _add_serve(add("serve", cmd_serve))
    p = add("convert", cmd_convert)
    p.add_argument("source", help="a zoo checkpoint directory or a Hugging Face one")
    p.add_argument("destination", help="directory to write (atomically)")
    p.add_argument(
        "--to", default="zoo", help="target layout: zoo (default), hf-gpt2 or hf-openai-gpt"
    )
    _add_max_shard_size(p)
    p = add("check", cmd_check)
    p.add_argument("names", nargs="+", metavar="NAME", help="named models to check")
    p.add_argument(
        "--device",
        action="append",
        help="device to check on (repeatable); default: cpu, and cuda when available",
    )
    p = add("push", cmd_push)
    p.add_argument(
        "directory",
        metavar="DIR",
        help="a checkpoint directory written by zoo.save or zoo convert, or a training run's "
        "folder (zoo train --out)",
    )
    p.add_argument("repo", metavar="REPO", help="Hub repo id, org/name")
    p.add_argument("--revision", help="branch to commit to (default: the main branch)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--message", help="commit message")
    _add_max_shard_size(p)
    p = add("pull", cmd_pull)
    p.add_argument(
        "name", metavar="NAME_OR_REPO", help="a named model with Hub weights, or org/name[@rev]"
    )
    p.add_argument("--revision", help="branch, tag or commit sha")
    return parser


def _version() -> str:
    from . import __version__

    return __version__


def _check_model(args: argparse.Namespace) -> None:
    """``zoo generate``, ``chat`` and ``serve``: the model (a named model with ``--random``)
    and ``--tokenizer`` exist, as loading them will require."""
    from . import loading

    if args.random:
        api.resolve_config(args.source)
    else:
        loading.check_source(args.source)
    if args.tokenizer:
        api.check_tokenizer(args.tokenizer)


def _check_generate(args: argparse.Namespace) -> None:
    _generate_config(args)
    _check_model(args)


def _check_chat(args: argparse.Namespace) -> None:
    _chat_config(args)
    _check_model(args)


def _check_serve(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be from 0 to 65535 (0 picks a free port), got {args.port}")
    _check_model(args)


def _check_classify(args: argparse.Namespace) -> None:
    from . import loading

    for i, text in enumerate(args.texts):
        _check_utf8(text, f"text {i + 1}")
    loading.check_source(args.checkpoint)
    if args.tokenizer:
        api.check_tokenizer(args.tokenizer)


def _check_train(args: argparse.Namespace) -> None:
    from . import loading
    from .tokenizers.files import read_manifest
    from .train.files import text_files

    if (args.model is None) == (args.source is None):
        raise ValueError(
            "name the model once: NAME for a new model with random weights, or --from SOURCE "
            "(a checkpoint directory, hf:org/name, or a named model with weights) to fine-tune"
        )
    if args.tokenizer_max_distinct is not None and args.train_tokenizer is None:
        raise ValueError("--tokenizer-max-distinct goes with --train-tokenizer")
    if args.model is not None:
        api.resolve_config(args.model, **dict(_override(item) for item in args.set or ()))
    else:
        if args.train_tokenizer is not None:
            raise ValueError("--train-tokenizer makes a new vocabulary: it needs a new model")
        if args.set:
            raise ValueError("--set changes the config of a new model: it cannot go with --from")
        loading.check_source(args.source)
    text_files(args.data)
    if args.tokenizer is not None:
        read_manifest(args.tokenizer)
    _train_config(args)


def _check_names(args: argparse.Namespace) -> None:
    for name in args.names:
        api.resolve_config(name)  # unknown names fail fast with suggestions


def _check_convert(args: argparse.Namespace) -> None:
    from . import loading

    loading.check_source(args.source)


#: Each command's checks of its arguments that need no torch (names known, files present,
#: numbers in range), made before the command runs: a typo is reported in a fraction of a
#: second, not after torch has loaded. They call what the command relies on later, so the
#: messages are the same. (list, info, plugins, pull and push import no torch at all.)
_CHECKS: dict[str, Callable[[argparse.Namespace], None]] = {
    "generate": _check_generate,
    "chat": _check_chat,
    "serve": _check_serve,
    "classify": _check_classify,
    "train": _check_train,
    "check": _check_names,
    "convert": _check_convert,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``zoo`` console script."""
    args = build_parser().parse_args(argv)
    try:
        _CHECKS.get(args.command, lambda args: None)(args)
        return args.func(args)
    except (ZooError, KeyError, ValueError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"zoo: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zoo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
