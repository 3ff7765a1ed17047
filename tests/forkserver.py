"""A fork server for tests that start many short-lived Python processes.

A fresh interpreter pays Python's and torch's start-up (2 s or more on 2 cores) before it does
anything. :class:`ForkServer` starts one Python process, runs a set-up (imports, models) in it
once, and then forks a child from it for each request: each child is a real process of its
own (it can be killed with ``SIGKILL`` mid-write, it runs concurrently with its siblings), but
starts where the set-up left off, in milliseconds. :class:`Forked` stands for a child the way
``subprocess.Popen`` stands for a process: ``pid``, ``wait(timeout)``, ``kill()``,
``returncode`` (``-9`` once killed).

With ``one_thread`` (the default) the server runs with ``OMP_NUM_THREADS=1``: a set-up that
computes with torch then leaves no thread pool to be copied into a child half-initialised (a
pool's threads do not survive ``fork``). ``import torch`` alone starts none (only OpenBLAS's,
which is fork-safe), so a server that only imports may keep the threads a process would have.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

#: The server: runs the set-up, answers "ready", then one JSON request a line on stdin, one
#: JSON answer a line on stdout. A child runs its code with stdin on /dev/null and stdout on
#: the server's stderr (never the answers' pipe), and ends as a Python process ends: its
#: ``SystemExit`` code, 0, or 1 after a traceback, once atexit handlers have run.
SERVER = r"""
import gc, json, os, signal, sys, time
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
namespace = {"__name__": "__forkserver__"}
setup = sys.stdin.readline()
exec(compile(json.loads(setup), "<setup>", "exec"), namespace)
# What the set-up made lives on in every child, its pages shared with the server until
# written to: a child's garbage collector walks those objects (and writes to each page it
# visits, copying it), down to the last collection as the child ends (a zoo command forked
# from a server that had imported torch and matplotlib took 1.9 s to end, 0.5 s with this).
# Frozen (Python's advice before forking), they are left alone; the child's own objects are
# collected as in any process.
gc.freeze()
answers.write("ready\n")
answers.flush()
children = set()


def fork(code):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        children.add(pid)
        return pid
    # the child: it ends as a Python process does, SystemExit's code or 1 after a traceback
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    answers.close()
    exec(compile(code, "<child>", "exec"), dict(namespace))
    sys.exit(0)


def wait(pid, timeout):
    deadline = time.monotonic() + timeout if timeout is not None else None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            return os.waitstatus_to_exitcode(status)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "fork":
        answer = {"pid": fork(request["code"])}
    else:
        answer = {"returncode": wait(request["pid"], request["timeout"])}
    answers.write(json.dumps(answer) + "\n")
    answers.flush()
for pid in children:  # the test is over: no child outlives the server
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""


class ForkServer:
    """One Python process that has run ``setup`` and forks children that run code from there."""

    def __init__(
        self,
        setup: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        one_thread: bool = True,
    ) -> None:
        env = dict(os.environ if env is None else env)
        if one_thread:
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self._process = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        self._send(setup)
        self._ready = False  # the set-up runs meanwhile; the first request waits for it

    def _wait_ready(self) -> None:
        if self._ready:
            return
        assert self._process.stdout is not None
        if self._process.stdout.readline() != "ready\n":
            self.close()
            raise RuntimeError(f"the fork server's set-up failed (exit {self._process.returncode})")
        self._ready = True

    def _send(self, request: Any) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self._wait_ready()
        self._send(request)
        assert self._process.stdout is not None
        answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError("the fork server died")
        reply: dict[str, Any] = json.loads(answer)
        return reply

    def start(self, code: str) -> Forked:
        """A child that runs ``code`` in a copy of the set-up's namespace, then exits."""
        return Forked(self, self._ask({"op": "fork", "code": code})["pid"])

    def close(self) -> None:
        """End the server, killing any child not waited for."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=60)
        if self._process.stdout is not None:
            self._process.stdout.close()


class Forked:
    """A child of a :class:`ForkServer`, used like ``subprocess.Popen``."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (``-N`` for signal N), once the child has ended; raises
        ``subprocess.TimeoutExpired`` if it has not within ``timeout`` seconds."""
        if self.returncode is None:
            answer = self._server._ask({"op": "wait", "pid": self.pid, "timeout": timeout})
            if answer["returncode"] is None:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0.0)
            self.returncode = answer["returncode"]
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """``SIGKILL``, as ``Popen.kill``: the child stops wherever it is."""
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)
