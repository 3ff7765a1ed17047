"""``python -m zoo.localhub``: serve a local Hub until Ctrl-C."""

from __future__ import annotations

import threading
from pathlib import Path

from .repos import LocalHub


def main(argv: list[str] | None = None) -> int:
    """``python -m zoo.localhub``: serve a local Hub until Ctrl-C."""
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m zoo.localhub",
        description="Serve a Hugging Face Hub-compatible server on 127.0.0.1, to try "
        "`zoo push` and zoo.load('hf:org/name') offline.",
    )
    parser.add_argument("--port", type=int, default=8642, help="port (default 8642; 0: any)")
    parser.add_argument(
        "--root", help="folder for the uploaded files (default: a temporary one, deleted on exit)"
    )
    parser.add_argument("--token", default="hf_local", help="the accepted token (write access)")
    parser.add_argument("--user", default="local-user", help="the token's account name")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    if args.root is not None:
        Path(args.root).mkdir(parents=True, exist_ok=True)
    hub = LocalHub(args.token, user=args.user, root=args.root, port=args.port)
    try:
        hub.start()
    except OSError as exc:
        print(f"cannot listen on 127.0.0.1:{args.port} ({exc}); try --port 0", file=sys.stderr)
        return 1
    print(
        f"A local Hub is serving on {hub.endpoint} (repos live in memory until it stops; "
        f"files under {hub._root}).\n"
        "In the shell where you run zoo, export:\n"
        f"  export HF_ENDPOINT={hub.endpoint}\n"
        "  export HF_HUB_DISABLE_XET=1\n"
        f"  export HF_TOKEN={args.token}\n"
        "then, e.g.:\n"
        "  zoo push CHECKPOINT_DIR org/name\n"
        "  python -c 'import zoo; print(zoo.load(\"hf:org/name\"))'\n"
        "Ctrl-C stops it.",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` cleans up like Ctrl-C
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
