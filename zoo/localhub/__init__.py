"""A local Hugging Face Hub-compatible HTTP server, to try ``zoo push`` and ``zoo.load("hf:...")``
without the internet (stdlib only)::

    python -m zoo.localhub [--port 8642] [--root DIR]

prints the environment variables to export in another shell (``HF_ENDPOINT``,
``HF_HUB_DISABLE_XET=1``, ``HF_TOKEN``). In Python::

    with LocalHub(token="hf_test") as hub:
        sha = hub.add_files("openai-community/gpt2", {"config.json": b"{}"})
        ...  # point HF_ENDPOINT at hub.endpoint

``LocalHub`` speaks the subset of the Hub protocol that ``huggingface_hub`` 2.x uses to create
repos, upload (regular files and plain git-LFS, i.e. with ``HF_HUB_DISABLE_XET=1``), inspect and
download them. It binds 127.0.0.1 (an ephemeral port unless one is given) and serves from a
daemon thread. The test suite's hostile variants (outages, cut or corrupt downloads, lying
headers) subclass it in ``tests/hubserver.py``.

Semantics
---------
* Git-like history: every commit gets a fresh 40-hex sha; branches point at commits; a
  ``revision`` is a branch name or a full commit sha; old commits stay downloadable.
* A new repo starts with an initial commit holding the Hub's default ``.gitattributes``. A file
  is stored as LFS when it matches a ``filter=lfs`` pattern of that file, is 10 MiB or larger, or
  looks binary (a NUL byte in its first 512 bytes); the same rule answers ``preupload``.
* ``ETag`` is the git blob sha1 for regular files and the content sha256 for LFS files (as on the
  Hub); LFS files also carry ``X-Linked-Etag``/``X-Linked-Size``. Files are served directly (no
  CDN redirect), with ``Range`` support so the client can resume.
* Auth: one accepted token (``Authorization: Bearer <token>``). A request carrying any *other*
  bearer token gets 401 "Invalid credentials in Authorization header", as the Hub does, even on
  public reads. Writes need the token. Reads of public repos need no token (as on the Hub) unless
  ``require_auth_for_reads`` is set; private repos answer 401 ``RepoNotFound`` without it.
* Errors carry the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
  ``EntryNotFound``) and ``X-Error-Message`` headers plus a JSON ``{"error": ...}`` body, so
  ``huggingface_hub`` raises its own exception types.
* Repo ids must be ``namespace/name``; ``create_repo("name")`` lands in the hub's user namespace.

Blobs live content-addressed on disk (``root``), so serving a large checkpoint costs no memory;
metadata (repos, commits, branches) lives in memory: a restarted server starts empty.
"""

from .repos import LocalHub
from .storage import DEFAULT_GITATTRIBUTES, FileEntry, HubError, RequestRecord

__all__ = ["DEFAULT_GITATTRIBUTES", "FileEntry", "HubError", "LocalHub", "RequestRecord"]
