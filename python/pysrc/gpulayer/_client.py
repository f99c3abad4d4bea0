"""The connection the package's functions use unless given one: the CLI's settings
(GPULAYER_URL, GPULAYER_TOKEN and GPULAYER_FINGERPRINT, then the config file `gpulayer up`
wrote)."""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Optional, TypeVar

from gpulayer import _native
from gpulayer.errors import raise_native

T = TypeVar("T")

_lock = threading.Lock()
_default: Optional["_native.NativeClient"] = None


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Calls a native method, turning its error into the public exception of its kind."""
    try:
        return fn(*args, **kwargs)
    except _native.NativeError as e:
        raise_native(e)


def connect(
    url: Optional[str] = None,
    token: Optional[str] = None,
    fingerprint: Optional[str] = None,
) -> "_native.NativeClient":
    """Connects to a server (``url`` may list replicas comma-separated) and makes it the
    default for this process. ``fingerprint`` (``sha256:...``, as ``gpulayer up`` printed it)
    pins the server's certificate: a server presenting another is refused. Without
    arguments, uses the CLI's settings."""
    global _default
    client = call(_native.NativeClient, url, token, fingerprint)
    with _lock:
        _default = client
    return client


def client() -> "_native.NativeClient":
    """The default connection, made on first use."""
    global _default
    with _lock:
        if _default is None:
            _default = call(_native.NativeClient)
        return _default


def loads(text: str) -> Any:
    return json.loads(text)
