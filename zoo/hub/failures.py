"""Turning ``huggingface_hub`` and HTTP exceptions into zoo errors that say what to do.

``huggingface_hub`` reports an unreachable Hub, a refused token, a missing repo or a cut
download with a dozen exception types (some from its HTTP library); every Hub call in zoo goes
through :func:`hub_errors`, so users see one of :class:`~zoo.errors.HubAuthError`,
:class:`~zoo.errors.HubNotFoundError`, :class:`~zoo.errors.HubUnavailableError` (or its
:class:`~zoo.errors.HubOfflineError`) with the endpoint, the repo and a fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..errors import (
    HubAuthError,
    HubError,
    HubNotFoundError,
    HubOfflineError,
    HubUnavailableError,
)

__all__ = [
    "endpoint",
    "hub_errors",
    "is_offline",
    "redirect_loop",
    "transport_errors",
    "unreachable",
]


def endpoint() -> str:
    """The Hub endpoint in use (``HF_ENDPOINT``, as ``huggingface_hub`` read it)."""
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def is_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (as ``huggingface_hub`` read it)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's errors of a request that got no usable answer (``httpx2`` or
    ``httpx``, by version): a connection that failed, and a redirect loop
    (``TooManyRedirects``) or an undecodable body, which are ``RequestError`` s too."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            errors.append(__import__(module).RequestError)
    return tuple(errors)


def redirect_loop(exc: BaseException) -> str | None:
    """What a redirect loop (``TooManyRedirects``) was, with its last URL; ``None`` for any
    other error."""
    if type(exc).__name__ != "TooManyRedirects":
        return None
    try:
        url = str(exc.request.url)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        url = "its URL"
    return (
        f"redirected the request in a loop (more redirects than allowed, the last to {url[:200]})"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _root(exc: BaseException) -> BaseException:
    """The innermost cause of ``exc`` (what actually went wrong on the wire)."""
    seen = {id(exc)}
    while (cause := exc.__cause__ or exc.__context__) is not None and id(cause) not in seen:
        seen.add(id(cause))
        exc = cause
    return exc


def _why(exc: BaseException) -> str:
    """``"Type: first line"`` of ``exc``, plus its root cause when that says more."""
    root = _root(exc)
    text = _first_line(exc)
    if root is not exc and str(root).strip() and str(root).strip() not in str(exc):
        text += f"; caused by {_first_line(root)}"
    return text


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def unreachable(
    what: str, exc: BaseException | None = None, *, pull: str | None = None
) -> HubUnavailableError:
    """The error for files that are neither downloadable nor cached (offline or not);
    ``pull`` is what to pass to ``zoo pull`` to fetch them."""
    if is_offline():
        return HubOfflineError(
            f"{what}: HF_HUB_OFFLINE is set and it is not in the Hugging Face cache "
            f"({_cache()}). Run `zoo pull {pull or '...'}` once with network access, unset "
            "HF_HUB_OFFLINE, or point HF_HUB_CACHE (or HF_HOME) at a cache that holds it."
        )
    root = _root(exc) if exc is not None else None
    status = _status(root) if root is not None else None
    if status is not None:
        why = f"answered {status} ({_first_line(root)})"  # type: ignore[arg-type]
    else:
        why = "could not be reached" + (f" ({_first_line(root)})" if root is not None else "")
    return HubUnavailableError(
        f"{what}: the Hub at {endpoint()} {why}, and it is not in the Hugging Face cache "
        f"({_cache()}). Check the network and HF_ENDPOINT, then try again; with a warm "
        "cache, HF_HUB_OFFLINE=1 works without the network."
    )


#: What a failed push says about its state and how to retry (see :func:`hub_errors`).
PUSH_RETRY = (
    "The push is one commit, so no partial commit was made: the repo holds all of the new "
    "files or none of them (the repo or branch may have been created, and files uploaded "
    "before the failure are kept by the Hub outside any commit). Run the same push again to "
    "retry: files the Hub already has are not sent again."
)


@contextlib.contextmanager
def hub_errors(what: str, *, pull: str | None = None, push: bool = False) -> Iterator[None]:
    """Re-raise Hub failures inside the block as zoo errors; ``what`` names the operation and
    the repo (``"hf:openai-community/gpt2@main"``) at the start of every message, ``pull``
    what ``zoo pull`` takes to fetch it (for the offline hint). ``push``: the block uploads,
    and the messages say what that means for the repo and how to retry (not the cache)."""
    import json

    from huggingface_hub import errors as hf

    try:
        yield
    except HubError:
        raise
    except (RecursionError, json.JSONDecodeError) as exc:  # inside huggingface_hub's parsing
        raise HubError(
            f"{what}: the Hub at {endpoint()} sent an answer that could not be read ("
            f"{'nested too deeply' if isinstance(exc, RecursionError) else _first_line(exc)}); "
            "nothing was downloaded. Check HF_ENDPOINT: it should be a Hugging Face Hub."
        ) from None
    except (hf.OfflineModeIsEnabled, hf.LocalEntryNotFoundError, hf.RevisionResolutionError) as e:
        if push:
            raise HubUnavailableError(
                f"{what}: the push could not reach the Hub at {endpoint()} ({_why(e)}). "
                "Pushing needs the Hub: unset HF_HUB_OFFLINE and check the network and "
                f"HF_ENDPOINT. {PUSH_RETRY}"
            ) from e
        raise unreachable(what, e, pull=pull) from e
    except hf.GatedRepoError as exc:
        raise HubAuthError(
            f"{what}: the repo is gated and this token has not been granted access "
            f"({_why(exc)}). Request access on its Hub page, then use a token of that account "
            "(HF_TOKEN, `hf auth login`, or token=...)."
        ) from exc
    except hf.RepositoryNotFoundError as exc:
        raise HubNotFoundError(
            f"{what}: no such repo on {endpoint()}, or it is private and the token in use "
            "does not grant access. Check the repo id and HF_ENDPOINT; for a private repo set "
            "HF_TOKEN (or pass token=...)."
        ) from exc
    except hf.RevisionNotFoundError as exc:
        raise HubNotFoundError(
            f"{what}: the revision does not exist in the repo. Use a branch, tag or commit "
            "sha of the repo (its page lists them)."
        ) from exc
    except hf.EntryNotFoundError as exc:
        raise HubNotFoundError(f"{what}: the file is not in the repo ({_why(exc)})") from exc
    except hf.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        raise _http_error(what, exc, status, push=push) from exc
    except transport_errors() as exc:
        raise _connection_failed(what, exc, push=push) from exc


def _http_error(what: str, exc: BaseException, status: int | None, *, push: bool) -> HubError:
    """The error for an HTTP answer ``status`` of the Hub: a refused token, a server error
    (during a push: what that means for the repo), or any other status."""
    if status in (401, 403):
        return HubAuthError(
            f"{what}: the Hub at {endpoint()} refused the token ({status}: "
            f"{str(exc).strip().splitlines()[0]}). Check HF_TOKEN (or the token=... "
            "argument, or the login saved by `hf auth login`): it must be valid for this "
            "Hub and, to push, have write access to the repo."
        )
    if status is not None and status >= 500 and push:
        return HubUnavailableError(
            f"{what}: the Hub at {endpoint()} answered {status} (server error) during the "
            f"push: {_why(exc)}. {PUSH_RETRY} Try again later."
        )
    if status is not None and status >= 500:
        return HubUnavailableError(
            f"{what}: the Hub at {endpoint()} answered {status} (server error): "
            f"{_why(exc)}. Try again later; with a warm cache, HF_HUB_OFFLINE=1 works "
            "without the Hub."
        )
    return HubError(
        f"{what}: the Hub at {endpoint()} answered {status}: {_why(exc)}"
        + (f". {PUSH_RETRY}" if push else "")
    )


def _connection_failed(what: str, exc: BaseException, *, push: bool) -> HubUnavailableError:
    """The error for a connection to the Hub that failed or a redirect loop (during a push:
    what that means for the repo)."""
    loop = redirect_loop(exc)
    if loop is not None:
        return HubUnavailableError(
            f"{what}: the Hub at {endpoint()} {loop}. "
            + (PUSH_RETRY + " " if push else "Nothing was downloaded. ")
            + "The endpoint (HF_ENDPOINT) or a proxy in between is misconfigured: check them, "
            "or try again later."
        )
    if push:
        return HubUnavailableError(
            f"{what}: the connection to the Hub at {endpoint()} failed during the push "
            f"({_why(exc)}). {PUSH_RETRY} Check the network and HF_ENDPOINT first."
        )
    return HubUnavailableError(
        f"{what}: the connection to the Hub at {endpoint()} failed ({_why(exc)}). Nothing "
        "incomplete was kept or loaded; try again (a cut connection resumes within a pull; "
        "a new pull starts a file over)."
    )
