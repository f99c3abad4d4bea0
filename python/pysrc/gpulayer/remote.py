"""Remote functions: ``@gl.remote`` runs a Python function on a worker that fits it.

``fn.remote(*args)`` runs it once and returns its value; ``fn.spawn(*args)`` returns a
``Call`` at once; ``fn.map(items)`` fans out over the free workers and yields results in input
order; ``fn(*args)`` still runs it here. The function and its arguments travel with
cloudpickle (so the worker's Python must have the caller's minor version; the scheduler only
sends calls where it does), and run in warm runners on the workers.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import linecache
import re
import sys
import time
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    TypeVar,
    Union,
)

from gpulayer import _client
from gpulayer._client import call, loads
from gpulayer.errors import (
    BadInput,
    GpulayerError,
    JobFailed,
    RemoteError,
    ResultTooLarge,
    SerializationError,
)
from gpulayer.jobs import Frameworks, submit_args

R = TypeVar("R")

#: The largest pickled arguments one call carries (the server's limit).
MAX_ARGS_BYTES = 1 << 20

#: Calls submitted per request by ``map``: workers start on the first while the rest travel.
MAP_CHUNK = 1000

#: How long one results request may be held open by the server.
RESULTS_WAIT_MS = 20_000

#: Calls asked about per results request.
RESULTS_PER_REQUEST = 10_000


class RemoteTraceback(Exception):
    """The traceback of an exception raised remotely, as its ``__cause__``."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\nRemote traceback:\n" + self.text


def _cloudpickle() -> Any:
    try:
        import cloudpickle
    except ImportError:
        raise GpulayerError(
            "remote functions need cloudpickle: pip install cloudpickle"
        ) from None
    return cloudpickle


def _python_minor() -> str:
    return "%d.%d" % sys.version_info[:2]


def _is_user_module(name: str) -> bool:
    """Whether a module is the user's own code (shipped by value) rather than something
    installed (imported by name on the worker)."""
    if name in ("__main__", "__mp_main__"):
        return False  # cloudpickle ships __main__ by value already
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) or ""
    installed = ("site-packages" in path or "dist-packages" in path
                 or path.startswith(sys.base_prefix) or path.startswith(sys.prefix))
    return bool(path) and not installed


def _dumps(obj: Any, what: str, by_value: Optional[str] = None) -> bytes:
    cp = _cloudpickle()
    module = sys.modules.get(by_value) if by_value and _is_user_module(by_value) else None
    if module is not None:
        cp.register_pickle_by_value(module)
    try:
        return cp.dumps(obj)
    except Exception as e:
        raise SerializationError(
            f"cannot pickle {what}: {e}; define functions and classes at module level and do "
            "not capture objects that cannot travel (locks, sockets, open files, clients)"
        ) from e
    finally:
        if module is not None:
            cp.unregister_pickle_by_value(module)


_DYNAMIC_FRAME = re.compile(r'^(\s*)File "<dynamic-code>", line (\d+), in (.+)$')


def _with_local_sources(text: str, source_file: Optional[str]) -> str:
    """The remote traceback with its frames in code shipped by value (which cloudpickle
    names ``<dynamic-code>``) pointed back at the caller's file, source lines included."""
    if not source_file:
        return text
    out: List[str] = []
    for line in text.splitlines():
        m = _DYNAMIC_FRAME.match(line)
        if not m:
            out.append(line)
            continue
        indent, number, name = m.groups()
        out.append(f'{indent}File "{source_file}", line {number}, in {name}')
        source = linecache.getline(source_file, int(number)).strip()
        if source:
            out.append(f"{indent}  {source}")
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _rebuild_exception(error: Mapping[str, Any], source_file: Optional[str] = None) -> BaseException:
    kind = error.get("kind")
    message = error.get("message", "")
    if kind == "too_large":
        return ResultTooLarge(message)
    if kind == "serialization":
        return SerializationError(message)
    text = _with_local_sources(error.get("traceback", ""), source_file)
    pickled = error.get("pickled")
    if pickled:
        try:
            exc = _cloudpickle().loads(base64.b64decode(pickled))
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            exc.__cause__ = RemoteTraceback(text)
            if hasattr(exc, "add_note"):
                exc.add_note("(raised remotely; the remote traceback is its __cause__)")
            return exc
    return RemoteError(error.get("type", "Exception"), message, text)


def _echo(lines: List[List[Any]]) -> None:
    """The call's own output, where the caller's goes."""
    for stream, text in lines:
        print(text, file=sys.stderr if stream == 2 else sys.stdout)
    if lines:
        sys.stdout.flush()


def _outcome(result: Mapping[str, Any], source_file: Optional[str] = None) -> Tuple[bool, Any]:
    """(True, value) or (False, the exception to raise) for a finished call; `source_file`
    is where the function's module lives here (for the remote traceback)."""
    _echo(result.get("lines") or [])
    ok = result.get("ok")
    if ok:
        return True, _cloudpickle().loads(base64.b64decode(result["payload"]))
    if ok is False and result.get("error"):
        return False, _rebuild_exception(result["error"], source_file)
    why = f": {result['reason']}" if result.get("reason") else ""
    return False, JobFailed(f"call {result['job']} {result['state']}{why}", dict(result))


class Call(Generic[R]):
    """One call running (or queued) remotely."""

    def __init__(self, id: int, source_file: Optional[str] = None) -> None:
        self.id = id
        self._source_file = source_file
        self._result: Optional[Tuple[bool, Any]] = None

    def __repr__(self) -> str:
        return f"Call({self.id})"

    def result(self, timeout: Optional[float] = None) -> R:
        """Waits for the call and returns its value, or raises what it raised. Raises
        ``TimeoutError`` after ``timeout`` seconds (the call goes on)."""
        if self._result is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            client = _client.client()
            while True:
                left = RESULTS_WAIT_MS if deadline is None else (deadline - time.monotonic()) * 1000
                found = loads(call(client.call_results, [self.id], int(max(0, min(left, RESULTS_WAIT_MS)))))
                if found["results"]:
                    self._result = _outcome(found["results"][0], self._source_file)
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"call {self.id} did not finish within {timeout} s")
        ok, value = self._result
        if ok:
            return value
        raise value

    def logs(self) -> List[str]:
        """The call's output lines so far."""
        from gpulayer.jobs import Job

        return Job(self.id).logs()

    def cancel(self) -> str:
        """Cancels the call; returns the state it was in."""
        from gpulayer.jobs import Job

        return Job(self.id).cancel()


class RemoteFunction(Generic[R]):
    """A function that runs on a worker; see ``gpulayer.remote``."""

    def __init__(self, fn: Callable[..., R], options: Dict[str, Any]) -> None:
        self._fn = fn
        self._options = options
        # Per server: the function's blob is uploaded to each server it is called on.
        self._prepared: Dict[str, Tuple[str, Dict[str, Any]]] = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        """Runs the function here, in this process."""
        return self._fn(*args, **kwargs)

    def _source_file(self) -> Optional[str]:
        """The file of the function's module when it travels by value (see `_dumps`)."""
        module = getattr(self._fn, "__module__", None)
        if module and _is_user_module(module):
            return getattr(sys.modules[module], "__file__", None)
        return None

    def _template(self) -> Tuple[str, Dict[str, Any]]:
        """(the function's digest, a spec to copy per call): pickled and uploaded once."""
        client = _client.client()
        prepared = self._prepared.get(client.url)
        if prepared is None:
            name = getattr(self._fn, "__qualname__", repr(self._fn))
            pickled = _dumps(self._fn, f"the function {name}", getattr(self._fn, "__module__", None))
            digest = hashlib.sha256(pickled).hexdigest()
            flags = submit_args(**self._options)
            spec = loads(call(client.spec, [*flags, "--", "python", name]))
            call(client.put_blob, digest, pickled)
            prepared = self._prepared[client.url] = (digest, spec)
        return prepared

    def _spec(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> str:
        digest, template = self._template()
        pickled = _dumps((args, kwargs), "the arguments")
        if len(pickled) > MAX_ARGS_BYTES:
            raise SerializationError(
                f"the arguments pickle to {len(pickled)} bytes, more than the "
                f"{MAX_ARGS_BYTES >> 20} MiB a call carries; pass large data as files instead"
            )
        spec = dict(template)
        spec["call"] = {
            "function": digest,
            "args": base64.b64encode(pickled).decode(),
            "python": _python_minor(),
        }
        return json.dumps(spec)

    def spawn(self, *args: Any, **kwargs: Any) -> Call[R]:
        """Submits one call and returns at once. Raises ``SchedulingError`` with every
        worker's reason when no worker could run it."""
        view = loads(call(_client.client().submit, self._spec(args, kwargs), None))
        return Call(view["id"], self._source_file())

    def remote(self, *args: Any, **kwargs: Any) -> R:
        """Runs the function once on a worker and returns its value (or raises what it
        raised there)."""
        # One request submits the call and waits for it; a long call is waited for after.
        answer = loads(call(_client.client().call, self._spec(args, kwargs), RESULTS_WAIT_MS))
        handle: Call[R] = Call(answer["job"], self._source_file())
        if answer.get("result") is not None:
            handle._result = _outcome(answer["result"], handle._source_file)
        return handle.result()

    def map(
        self,
        *iterables: Iterable[Any],
        order_outputs: bool = True,
        return_exceptions: bool = False,
    ) -> Iterator[Any]:
        """Calls the function on every item (several iterables: on their zipped items) across
        the free workers; yields results in input order (completion order with
        ``order_outputs=False``). A call's exception is raised when its result is reached,
        or yielded in its place with ``return_exceptions=True``."""
        return self._run_many(
            [(tuple(a), {}) for a in zip(*iterables)], order_outputs, return_exceptions
        )

    def starmap(
        self,
        iterable: Iterable[Iterable[Any]],
        order_outputs: bool = True,
        return_exceptions: bool = False,
    ) -> Iterator[Any]:
        """``map`` for items that are argument tuples: ``fn(*item)``."""
        return self._run_many([(tuple(a), {}) for a in iterable], order_outputs, return_exceptions)

    def _run_many(
        self,
        calls: List[Tuple[Tuple[Any, ...], Dict[str, Any]]],
        order_outputs: bool,
        return_exceptions: bool,
    ) -> Iterator[Any]:
        if not calls:
            return iter(())
        specs = [self._spec(a, k) for a, k in calls]
        client = _client.client()
        # Refuse before anything is stored when nobody could run it (one check for all).
        report = loads(call(client.placement, specs[0]))
        if report["eligible_workers"] == 0 and report["verdicts"]:
            from gpulayer.errors import SchedulingError

            raise SchedulingError(report["table"], report)
        ids: List[int] = []
        for i in range(0, len(specs), MAP_CHUNK):
            ids.extend(call(client.submit_many, specs[i : i + MAP_CHUNK]))
        return self._results(ids, order_outputs, return_exceptions)

    def _results(self, ids: List[int], order_outputs: bool, return_exceptions: bool) -> Iterator[Any]:
        client = _client.client()
        source = self._source_file()
        position = {job: i for i, job in enumerate(ids)}
        pending = list(ids)
        done: Dict[int, Tuple[bool, Any]] = {}
        next_out = 0
        while pending or (order_outputs and next_out < len(ids)):
            if pending:
                asked = pending[:RESULTS_PER_REQUEST]
                found = loads(call(client.call_results, asked, RESULTS_WAIT_MS))["results"]
                finished = set()
                for r in found:
                    finished.add(r["job"])
                    done[position[r["job"]]] = _outcome(r, source)
                if finished:
                    pending = [j for j in pending if j not in finished]
            ready: List[int]
            if order_outputs:
                ready = []
                while next_out < len(ids) and next_out in done:
                    ready.append(next_out)
                    next_out += 1
            else:
                ready = sorted(i for i in done)
            for i in ready:
                ok, value = done.pop(i)
                if ok or return_exceptions:
                    yield value
                else:
                    raise value


def remote(
    fn: Optional[Callable[..., R]] = None,
    *,
    accelerator: str = "any",
    devices: Union[int, str, None] = None,
    min_device_memory: Union[int, str, None] = None,
    frameworks: Frameworks = None,
    where: Optional[Mapping[str, str]] = None,
    retries: Optional[int] = None,
    timeout: Optional[float] = None,
    env: Optional[Mapping[str, str]] = None,
    name: Optional[str] = None,
) -> Any:
    """Makes ``fn`` a remote function: ``@gl.remote`` or ``@gl.remote(accelerator="cuda",
    frameworks={"torch": ">=2"}, retries=2, timeout=600, env={...})``.

    ``retries`` is how often a call is tried again, whether its worker was lost or the
    function raised; ``timeout`` (seconds) stops a call that runs longer.
    """
    options: Dict[str, Any] = {
        "accelerator": accelerator,
        "devices": devices,
        "min_device_memory": min_device_memory,
        "frameworks": frameworks,
        "where": where,
        "env": env,
        "name": name,
        "timeout": timeout,
    }
    if retries is not None:
        options["retries"] = retries
        options["retry_failed"] = retries > 0

    def wrap(f: Callable[..., R]) -> RemoteFunction[R]:
        if not callable(f):
            raise BadInput(f"@gl.remote needs a function, not {type(f).__name__}")
        return RemoteFunction(f, options)

    return wrap(fn) if fn is not None else wrap
