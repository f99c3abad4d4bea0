"""Remote functions against a real server and workers: values, order, exceptions with their
remote tracebacks, scheduling errors with reasons, lost workers, and bad input."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Iterator

import pytest

import gpulayer as gl
from conftest import Server


@gl.remote
def square(x: int) -> int:
    return x * x


@gl.remote
def add(a: int, b: int = 0) -> int:
    return a + b


@gl.remote
def shout(text: str) -> str:
    print(f"out: {text}")
    print(f"err: {text}", file=sys.stderr)
    return text.upper()


class Boom(ValueError):
    pass


@gl.remote
def explode(x: int) -> int:
    if x % 3 == 0:
        raise Boom(f"item {x} is a multiple of three")
    return x


class Unrebuildable(Exception):
    """Needs two arguments, so unpickling it (which passes one) fails on the caller."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}/{b}")


@gl.remote
def raise_unrebuildable() -> None:
    raise Unrebuildable("left", "right")


@gl.remote
def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


@gl.remote(frameworks={"jax": ">=0.4"})
def needs_jax() -> None:
    pass


def test_remote_returns_the_value_and_calling_runs_locally(server: Server) -> None:
    assert square.remote(7) == 49
    assert add.remote(2, b=3) == 5
    assert square(9) == 81  # here, in this process


def test_a_map_over_a_thousand_items_returns_every_value_in_input_order(server: Server) -> None:
    assert list(square.map(range(1000))) == [i * i for i in range(1000)]
    assert list(add.map([1, 2, 3], [10, 20, 30])) == [11, 22, 33]
    assert list(add.starmap([(1, 1), (2, 2)])) == [2, 4]
    assert sorted(square.map(range(50), order_outputs=False)) == [i * i for i in range(50)]
    assert list(square.map([])) == []


def test_warm_runners_keep_their_interpreter_between_calls(server: Server) -> None:
    pids = set(pid_after.map([0.0] * 40))
    # 4 slots: at most 4 runners served 40 calls.
    assert 1 <= len(pids) <= 4, pids


def test_a_remote_exception_is_raised_as_its_own_type_with_the_remote_traceback(
    server: Server,
) -> None:
    with pytest.raises(Boom, match="item 3 is a multiple of three") as e:
        explode.remote(3)
    cause = e.value.__cause__
    assert isinstance(cause, gl.RemoteTraceback)
    assert "in explode" in cause.text, cause.text
    # The frame points at this file, with its source line, as a local traceback would.
    assert f'File "{__file__}"' in cause.text, cause.text
    assert 'raise Boom(f"item {x} is a multiple of three")' in cause.text, cause.text
    assert "Boom: item 3 is a multiple of three" in cause.text, cause.text
    assert "in run" not in cause.text, cause.text
    got = list(explode.map(range(6), return_exceptions=True))
    assert [type(g).__name__ for g in got] == ["Boom", "int", "int", "Boom", "int", "int"]
    assert got[1:3] == [1, 2]
    with pytest.raises(Boom):
        list(explode.map(range(6)))


def test_an_exception_that_cannot_be_rebuilt_arrives_as_remote_error(server: Server) -> None:
    with pytest.raises(gl.RemoteError) as e:
        raise_unrebuildable.remote()
    assert e.value.type_name == "Unrebuildable"
    assert "left/right" in str(e.value)
    assert "in raise_unrebuildable" in e.value.remote_traceback


def test_the_calls_output_reaches_the_caller(server: Server, capsys: pytest.CaptureFixture) -> None:
    assert shout.remote("hi") == "HI"
    out = capsys.readouterr()
    assert "out: hi" in out.out
    assert "err: hi" in out.err


def test_spawn_gives_a_handle_with_result_logs_and_cancel(server: Server) -> None:
    c = shout.spawn("handle")
    assert c.result(timeout=60) == "HANDLE"
    assert "out: handle" in c.logs()
    slow = pid_after.spawn(600)
    with pytest.raises(TimeoutError):
        slow.result(timeout=0.2)
    assert slow.cancel() in ("pending", "assigned", "running")
    with pytest.raises(gl.JobFailed, match="cancelled"):
        slow.result(timeout=30)


def test_a_requirement_nobody_meets_raises_scheduling_error_with_the_reasons(server: Server) -> None:
    for attempt in (needs_jax.remote, lambda: list(needs_jax.map([(), ()]))):
        with pytest.raises(gl.SchedulingError) as e:
            attempt()
        assert str(e.value).startswith("scheduling: no eligible worker")
        assert list(e.value.reasons.values()) == ["framework 'jax' not installed"]


def test_a_function_that_cannot_be_pickled_raises_serialization_error(server: Server) -> None:
    lock = threading.Lock()

    @gl.remote
    def holds_a_lock() -> bool:
        return lock.locked()

    with pytest.raises(gl.SerializationError, match="cannot pickle the function"):
        holds_a_lock.remote()
    with pytest.raises(gl.SerializationError, match="cannot pickle the arguments"):
        square.remote(threading.Lock())


def test_a_worker_with_another_python_minor_version_is_not_sent_calls(bare_server: Server) -> None:
    bare_server.join("old-python", inventory={
        "hostname": "old", "os": "linux", "arch": "x86_64", "cpus": 2,
        "memory_bytes": 1 << 33, "devices": [], "python": "3.1.4",
    })
    bare_server.wait_for_workers(1)
    with pytest.raises(gl.SchedulingError) as e:
        square.remote(1)
    mine = "%d.%d" % sys.version_info[:2]
    assert e.value.reasons == {
        "old-python": f"runs Python 3.1.4, the caller runs {mine} (cloudpickle needs the same minor version)"
    }


def test_a_result_over_the_limit_raises_result_too_large(server: Server) -> None:
    s = Server(with_worker=True, env={"GPULAYER_MAX_RESULT_BYTES": "1000"})
    try:
        gl.connect(s.url, s.token, s.fingerprint)
        assert square.remote(3) == 9  # a small result passes
        with pytest.raises(gl.ResultTooLarge, match="more than the server's limit of 1000"):
            shout.remote("x" * 5000)
    finally:
        s.close()
        gl.connect(server.url, server.token, server.fingerprint)


def test_a_worker_killed_during_a_map_loses_no_item(bare_server: Server) -> None:
    doomed = bare_server.join("doomed", slots=2)
    bare_server.join("survivor", slots=2)
    bare_server.wait_for_workers(2)
    results: Iterator[int] = square_slowly.map(range(60))
    # Let the doomed worker take some items, then kill it mid-call.
    time.sleep(1.0)
    os.kill(doomed.pid, signal.SIGKILL)
    assert list(results) == [i * i for i in range(60)]


@gl.remote
def square_slowly(x: int) -> int:
    time.sleep(0.05)
    return x * x


def test_a_server_that_went_away_raises_connection_error(server: Server) -> None:
    gl.connect("http://127.0.0.1:9", "glc_nothing")
    try:
        with pytest.raises(gl.ConnectionError, match="cannot reach the GPUlayer server"):
            square.remote(1)
    finally:
        gl.connect(server.url, server.token, server.fingerprint)


@gl.remote(env={"GREETING": "hello from env"})
def read_env() -> str:
    return os.environ["GREETING"] + " / job " + os.environ["GPULAYER_JOB_ID"]


def test_env_reaches_the_call_and_leaves_the_runner_as_it_was(server: Server) -> None:
    call = read_env.spawn()
    assert call.result(timeout=60) == f"hello from env / job {call.id}"
    # The same runners serve other functions afterwards without the variable.
    assert not any(has_greeting.map(range(8)))


@gl.remote
def has_greeting(_: int) -> bool:
    return "GREETING" in os.environ


@gl.remote(retries=1)
def fails_once(marker: str) -> str:
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
    return "second attempt"


def test_retries_run_a_failing_call_again(server: Server, tmp_path) -> None:
    assert fails_once.remote(str(tmp_path / "marker")) == "second attempt"


@gl.remote(timeout=1)
def sleeps(seconds: float) -> None:
    time.sleep(seconds)


def test_a_call_past_its_timeout_is_stopped_and_says_so(server: Server) -> None:
    started = time.time()
    with pytest.raises(gl.JobFailed, match="timed out after 1 s"):
        sleeps.remote(30)
    assert time.time() - started < 15
