"""Command jobs from Python, mirroring the CLI: ``gl.submit``, ``gl.jobs``, ``gl.Job``."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from gpulayer import _client
from gpulayer._client import call, loads
from gpulayer.errors import BadInput, JobFailed

Frameworks = Union[Mapping[str, Optional[str]], Iterable[str], None]


def submit_args(
    *,
    accelerator: str = "any",
    devices: Union[int, str, None] = None,
    min_device_memory: Union[int, str, None] = None,
    frameworks: Frameworks = None,
    where: Optional[Mapping[str, str]] = None,
    outputs: Iterable[str] = (),
    env: Optional[Mapping[str, str]] = None,
    name: Optional[str] = None,
    priority: int = 0,
    timeout: Optional[float] = None,
    retries: Optional[int] = None,
    retry_failed: bool = False,
    nodes: int = 1,
    procs_per_node: int = 1,
    spread: str = "zone",
) -> List[str]:
    """The `gpulayer submit` flags for these requirements (checked by the CLI's own code)."""
    args = ["--accelerator", accelerator]
    if devices is not None:
        args += ["--devices", str(devices)]
    if min_device_memory is not None:
        args += ["--min-device-memory", str(min_device_memory)]
    if isinstance(frameworks, Mapping):
        items = [f"{k}{v or ''}" for k, v in frameworks.items()]
    else:
        items = list(frameworks or [])
    for f in items:
        args += ["--framework", f]
    for k, v in (where or {}).items():
        args += ["--where", f"{k}={v}"]
    for g in outputs:
        args += ["--output", g]
    for k, v in (env or {}).items():
        args += ["--env", f"{k}={v}"]
    if name is not None:
        args += ["--name", name]
    if priority:
        args += ["--priority", str(priority)]
    if timeout is not None:
        args += ["--timeout", str(int(timeout))]
    if retries is not None:
        args += ["--retries", str(retries)]
    if retry_failed:
        args.append("--retry-failed")
    if nodes != 1:
        args += ["--nodes", str(nodes)]
    if procs_per_node != 1:
        args += ["--procs-per-node", str(procs_per_node)]
    if spread != "zone":
        args += ["--spread", spread]
    return args


class Job:
    """A job on the server. ``Job(id)`` refers to an existing one."""

    def __init__(self, id: int, _view: Optional[Dict[str, Any]] = None) -> None:
        self.id = int(id)
        self._view = _view

    def __repr__(self) -> str:
        state = self._view["state"] if self._view else "?"
        return f"Job({self.id}, state={state!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def status(self) -> Dict[str, Any]:
        """The job as the server has it now (what `gpulayer status JOB --json` prints)."""
        self._view = loads(call(_client.client().job, self.id))
        return self._view

    @property
    def state(self) -> str:
        return self.status()["state"]

    def wait(self, timeout: Optional[float] = None, check: bool = True) -> Dict[str, Any]:
        """Waits for the job to end and returns its final status. Raises ``TimeoutError``
        after ``timeout`` seconds and, with ``check``, ``JobFailed`` unless it succeeded."""
        text = call(_client.client().wait, self.id, timeout)
        if text is None:
            raise TimeoutError(f"job {self.id} is still {self.state} after {timeout} s")
        self._view = loads(text)
        if check and self._view["state"] != "succeeded":
            why = f": {self._view['reason']}" if self._view.get("reason") else ""
            raise JobFailed(f"job {self.id} {self._view['state']}{why}", self._view)
        return self._view

    def logs(
        self, rank: Optional[int] = None, follow: bool = False, system: bool = False
    ) -> List[str]:
        """The job's output lines (stdout and stderr; with ``system``, GPUlayer's own lines
        about staging and stopping too). With ``follow``, also prints them as they arrive
        (stdout lines to stdout, the rest to stderr) until the job ends."""
        if not follow:
            lines = [loads(l) for l in call(_client.client().logs, self.id, rank)]
            return [l["text"] for l in lines if system or l["stream"] != "system"]
        got: List[str] = []

        def on_line(text: str) -> None:
            line = loads(text)
            if not system and line["stream"] == "system":
                return
            got.append(line["text"])
            stream = sys.stdout if line["stream"] == "stdout" else sys.stderr
            prefix = f"[rank {line['rank']}] " if line.get("rank") is not None else ""
            print(prefix + line["text"], file=stream, flush=True)

        call(_client.client().follow_logs, self.id, on_line, rank)
        return got

    def download(self, dest: Union[str, "os.PathLike[str]", None] = None) -> List[Path]:
        """Downloads the job's outputs into ``dest`` (default ``job-ID-outputs``); returns the
        files written."""
        target = Path(dest if dest is not None else f"job-{self.id}-outputs")
        files = call(_client.client().download, self.id, str(target))
        return [target / f for f in files]

    def cancel(self) -> str:
        """Cancels the job (a running one is stopped, process group and all); returns the
        state it was in."""
        return loads(call(_client.client().cancel, self.id))["previous_state"]


def submit(
    command: Union[str, Sequence[str]],
    *,
    source: Union[str, "os.PathLike[str]", None] = None,
    **requirements: Any,
) -> Job:
    """Submits a command as a job, as `gpulayer submit` does: ``command`` is an argv list or
    a shell-style string; ``source`` a directory to ship. Keyword arguments are the CLI's
    flags (``accelerator``, ``devices``, ``frameworks={"torch": ">=2"}``, ``where``,
    ``outputs``, ``env``, ``nodes``, ``procs_per_node``, ...). Raises ``SchedulingError``
    with every worker's reason, before anything is uploaded, when no worker could run it."""
    argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    if not argv:
        raise BadInput("the command is empty")
    try:
        flags = submit_args(**requirements)
    except TypeError as e:
        raise BadInput(str(e)) from None
    client = _client.client()
    spec = call(client.spec, [*flags, "--", *argv])
    view = loads(call(client.submit, spec, None if source is None else os.fspath(source)))
    return Job(view["id"], view)


def jobs(state: Optional[str] = None, limit: int = 50) -> List[Job]:
    """Jobs on the server, newest first."""
    listed = loads(call(_client.client().jobs, state, limit))
    return [Job(j["id"], j) for j in listed["jobs"]]
