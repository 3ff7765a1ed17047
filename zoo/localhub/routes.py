"""The local Hub's request handler: which URL (method and path) each request goes to.

Three URL families, as on the Hub:

* ``/api/...``: account and repo management (a fixed path each) and the per-repo API
  ``/api/{type}s/{org}/{name}/{action}/{args...}`` (:data:`_REPO_ROUTES`);
* ``/[{type}s/]{org}/{name}/resolve/{revision}/{path}``: file downloads;
* ``/[{type}s/]{org}/{name}.git/info/lfs/objects/{batch,verify}`` and ``/_lfs/{ticket}``: the
  git-LFS upload protocol.
"""

from __future__ import annotations

from collections.abc import Callable

from .commits import WriteRoutes
from .protocol import API_TYPES
from .read_api import ReadRoutes

__all__ = ["Handler"]

Answer = Callable[[], None]

#: ``(method, path under /api/)`` -> its answer, called with the handler.
_API_ROUTES: dict[tuple[str, str], Callable[[Handler], None]] = {
    ("GET", "whoami-v2"): lambda h: h._whoami(),
    ("GET", "agent-harnesses"): lambda h: h._agent_harnesses(),
    ("POST", "validate-yaml"): lambda h: h._validate_yaml(),
    ("POST", "repos/create"): lambda h: h._create_repo(),
    ("DELETE", "repos/delete"): lambda h: h._delete_repo(),
}

#: ``(method, action)`` of ``/api/{type}s/{org}/{name}/{action}/{args...}`` -> how many
#: arguments it takes (exactly n, or at least -n when negative) and its answer, called with
#: ``(handler, repo_type, repo_id, args)``.
_REPO_ROUTES: dict[tuple[str, str], tuple[int, Callable[[Handler, str, str, list[str]], None]]] = {
    ("GET", ""): (0, lambda h, t, r, a: h._repo_info(t, r, "main")),
    ("GET", "revision"): (1, lambda h, t, r, a: h._repo_info(t, r, a[0])),
    ("GET", "tree"): (-1, lambda h, t, r, a: h._tree(t, r, a[0], "/".join(a[1:]))),
    ("GET", "refs"): (0, lambda h, t, r, a: h._refs(t, r)),
    ("GET", "commits"): (1, lambda h, t, r, a: h._commits(t, r, a[0])),
    ("POST", "preupload"): (1, lambda h, t, r, a: h._preupload(t, r, a[0])),
    ("POST", "commit"): (1, lambda h, t, r, a: h._create_commit(t, r, a[0])),
    ("POST", "branch"): (-1, lambda h, t, r, a: h._create_branch(t, r, "/".join(a))),
}

#: ``(method, last segment)`` of ``{org}/{name}.git/info/lfs/objects/...`` -> its answer.
_LFS_ROUTES: dict[tuple[str, str], Callable[[Handler, str, str], None]] = {
    ("POST", "batch"): lambda h, t, r: h._lfs_batch(t, r),
    ("POST", "verify"): lambda h, t, r: h._lfs_verify(t, r),
}

_GIT_TAIL = ["info", "lfs", "objects"]


class Handler(ReadRoutes, WriteRoutes):
    """Routes Hub requests to :class:`~zoo.localhub.LocalHub` state."""

    def _route(self, method: str) -> Answer | None:
        s = self.segments
        if s[:1] == ["api"]:
            return self._route_api(method, s[1:])
        if method == "PUT" and len(s) == 2 and s[0] == "_lfs":
            return lambda: self._lfs_upload(s[1])
        repo_type, rest = ("model", s)
        if s and s[0] in ("datasets", "spaces"):
            repo_type, rest = API_TYPES[s[0]], s[1:]
        if len(rest) >= 5 and rest[2] == "resolve" and method in ("GET", "HEAD"):
            repo_id = "/".join(rest[:2])
            return lambda: self._resolve_file(method, repo_type, repo_id, rest[3], rest[4:])
        if len(rest) == 6 and rest[1].endswith(".git") and rest[2:5] == _GIT_TAIL:
            lfs = _LFS_ROUTES.get((method, rest[5]))
            repo_id = f"{rest[0]}/{rest[1][: -len('.git')]}"
            return None if lfs is None else lambda: lfs(self, repo_type, repo_id)
        return None

    def _route_api(self, method: str, s: list[str]) -> Answer | None:
        fixed = _API_ROUTES.get((method, "/".join(s)))
        if fixed is not None:
            return lambda: fixed(self)
        if len(s) < 3 or s[0] not in API_TYPES:
            return None
        return self._route_repo(method, API_TYPES[s[0]], f"{s[1]}/{s[2]}", s[3:])

    def _route_repo(
        self, method: str, repo_type: str, repo_id: str, rest: list[str]
    ) -> Answer | None:
        """``/api/{type}s/{org}/{name}/{action}/{args...}`` from :data:`_REPO_ROUTES`."""
        action, args = (rest[0], rest[1:]) if rest else ("", [])
        route = _REPO_ROUTES.get((method, action))
        if route is None:
            return None
        arity, answer = route
        if (arity >= 0 and len(args) != arity) or (arity < 0 and len(args) < -arity):
            return None
        return lambda: answer(self, repo_type, repo_id, args)

    def _agent_harnesses(self) -> None:
        self._send_json(200, {"standardEnvVars": [], "harnesses": {}})
