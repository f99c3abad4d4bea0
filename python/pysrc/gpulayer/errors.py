"""The exceptions of the gpulayer package: each says what went wrong and what to do."""

from __future__ import annotations

import builtins
import json
from typing import Any, Dict, NoReturn, Optional


class GpulayerError(Exception):
    """Base of every error this package raises."""


class ConnectionError(GpulayerError, builtins.ConnectionError):
    """The server cannot be reached (it went away, or the URL is wrong)."""


class AuthError(GpulayerError):
    """The server refused the token."""


class BadInput(GpulayerError, ValueError):
    """An argument is not valid; the message says which and why."""


class NotFound(GpulayerError, LookupError):
    """No such job (or other object) on the server."""


class SchedulingError(GpulayerError):
    """No worker could ever run the job. ``reasons`` maps each worker to why not; the
    message is the same table the CLI prints."""

    def __init__(self, message: str, report: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.report: Dict[str, Any] = report or {}
        self.reasons: Dict[str, str] = {
            v["worker"]: v.get("reason") or ""
            for v in self.report.get("verdicts", [])
            if not v.get("eligible", False)
        }


class JobFailed(GpulayerError):
    """A job ended other than succeeded; ``job`` is its final status."""

    def __init__(self, message: str, job: Dict[str, Any]) -> None:
        super().__init__(message)
        self.job = job


class SerializationError(GpulayerError):
    """A function, its arguments or its result cannot be pickled."""


class ResultTooLarge(GpulayerError):
    """A remote call's result is larger than the server accepts."""


class RemoteError(GpulayerError):
    """An exception raised remotely whose type cannot be rebuilt here: its type name and the
    remote traceback."""

    def __init__(self, type_name: str, message: str, traceback: str) -> None:
        super().__init__(f"{type_name}: {message}\n\nRemote traceback:\n{traceback}")
        self.type_name = type_name
        self.remote_traceback = traceback


_KINDS = {
    "connection": ConnectionError,
    "unauthorized": AuthError,
    "bad_input": BadInput,
    "not_found": NotFound,
    "too_large": ResultTooLarge,
}


def raise_native(e: BaseException) -> NoReturn:
    """Re-raises a ``_native.NativeError`` as the public exception of its kind."""
    kind, message, detail = e.args
    if kind == "scheduling":
        report = json.loads(detail) if detail else None
        text = report["table"] if report else message
        raise SchedulingError(text, report) from None
    raise _KINDS.get(kind, GpulayerError)(message) from None
