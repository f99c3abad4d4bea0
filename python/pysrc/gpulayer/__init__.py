"""GPUlayer from Python: ``import gpulayer as gl``.

``@gl.remote`` functions run on workers (``fn.remote``, ``fn.spawn``, ``fn.map``); command
jobs mirror the CLI (``gl.submit``, ``gl.jobs``, ``gl.Job``); the connection comes
from the same settings as the CLI's (GPULAYER_URL and GPULAYER_TOKEN, then the config file
``gpulayer up`` wrote), or from ``gl.connect(url, token)``.
"""

from gpulayer._client import connect
from gpulayer._native import __version__
from gpulayer.errors import (
    AuthError,
    BadInput,
    ConnectionError,
    GpulayerError,
    JobFailed,
    NotFound,
    RemoteError,
    ResultTooLarge,
    SchedulingError,
    SerializationError,
)
from gpulayer.jobs import Job, jobs, submit
from gpulayer.remote import Call, RemoteFunction, RemoteTraceback, remote

__all__ = [
    "AuthError",
    "Call",
    "BadInput",
    "ConnectionError",
    "GpulayerError",
    "Job",
    "JobFailed",
    "NotFound",
    "RemoteError",
    "RemoteFunction",
    "RemoteTraceback",
    "ResultTooLarge",
    "SchedulingError",
    "SerializationError",
    "__version__",
    "connect",
    "jobs",
    "remote",
    "submit",
]
