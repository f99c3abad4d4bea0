"""Command jobs from Python mirror the CLI: submit, wait, logs, download, cancel, errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpulayer as gl
from conftest import BIN, Server


def test_the_package_installs_the_gpulayer_command(server: Server) -> None:
    out = subprocess.run([BIN, "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("gpulayer ")
    assert Path(BIN).parent == Path(sys.executable).parent
    bad = server.cli("status", "nope")
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: "), bad.stderr


def test_a_submitted_command_runs_and_its_lines_and_outputs_come_back(
    server: Server, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "job.py").write_text(
        "import os, sys\n"
        "print('to stdout', flush=True); print('to stderr', file=sys.stderr)\n"
        "open(os.path.join(os.environ['GPULAYER_OUTPUT_DIR'], 'answer.txt'), 'w').write('42')\n"
    )
    job = gl.submit([sys.executable, "job.py"], source=src, accelerator="cpu", name="py-job")
    final = job.wait(timeout=60)
    assert final["state"] == "succeeded" and final["exit_code"] == 0
    assert final["name"] == "py-job"
    # Two pipes: their lines interleave as the worker reads them.
    assert sorted(job.logs()) == ["to stderr", "to stdout"]
    files = job.download(tmp_path / "out")
    assert [f.name for f in files] == ["answer.txt"]
    assert files[0].read_text() == "42"
    assert job in gl.jobs(limit=5)


def test_a_failing_job_raises_job_failed_with_its_reason(server: Server) -> None:
    job = gl.submit("sh -c 'exit 3'")
    with pytest.raises(gl.JobFailed) as e:
        job.wait(timeout=60)
    assert e.value.job["exit_code"] == 3
    assert "failed" in str(e.value)
    assert job.wait(check=False)["state"] == "failed"


def test_follow_prints_lines_as_they_arrive(server: Server, capsys: pytest.CaptureFixture) -> None:
    job = gl.submit([sys.executable, "-c", "print('a'); print('b')"])
    assert job.logs(follow=True) == ["a", "b"]
    assert capsys.readouterr().out == "a\nb\n"


def test_cancel_stops_a_running_job(server: Server) -> None:
    job = gl.submit("sleep 600")
    deadline = time.time() + 30
    while job.state != "running":
        assert time.time() < deadline
        time.sleep(0.05)
    assert job.cancel() == "running"
    assert job.wait(check=False)["state"] == "cancelled"


def test_requirements_nobody_meets_raise_scheduling_error_with_every_workers_reason(
    server: Server, tmp_path: Path
) -> None:
    with pytest.raises(gl.SchedulingError) as e:
        gl.submit("true", frameworks={"jax": ">=0.4"}, source=tmp_path)
    assert str(e.value).startswith("scheduling: no eligible worker\n")
    assert list(e.value.reasons.values()) == ["framework 'jax' not installed"]
    # The CLI prints the same table for the same job.
    cli = server.cli("submit", "--framework", "jax>=0.4", "--", "true")
    assert cli.returncode == 3
    assert cli.stderr.strip() == str(e.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"devices": "x"}, "'x' is not a device count"),
        ({"accelerator": "tpu"}, "tpu"),
        ({"env": {"1BAD": "v"}}, "1BAD"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_arguments_raise_bad_input_naming_the_argument(
    server: Server, kwargs: dict, message: str
) -> None:
    with pytest.raises(gl.BadInput, match=message):
        gl.submit("true", **kwargs)


def test_unknown_jobs_raise_not_found(server: Server) -> None:
    with pytest.raises(gl.NotFound, match="job 987654 does not exist"):
        gl.Job(987654).status()


def test_a_server_that_went_away_raises_connection_error(server: Server) -> None:
    gl.connect("http://127.0.0.1:9", "glc_nothing")
    try:
        with pytest.raises(gl.ConnectionError, match="cannot reach the GPUlayer server"):
            gl.jobs()
    finally:
        gl.connect(server.url, server.token, server.fingerprint)


def test_a_server_presenting_another_certificate_than_the_pinned_one_is_refused(server: Server) -> None:
    assert server.fingerprint and server.url.startswith("https://")
    wrong = "sha256:" + "0" * 64
    gl.connect(server.url, server.token, wrong)
    try:
        with pytest.raises(gl.ConnectionError, match=f"presented the certificate {server.fingerprint}, not the pinned {wrong}"):
            gl.jobs()
    finally:
        gl.connect(server.url, server.token, server.fingerprint)
    # Pinned to the right certificate, the same call goes through.
    assert isinstance(gl.jobs(), list)


def test_the_wheel_installs_the_command_and_the_module_into_a_fresh_venv(tmp_path: Path) -> None:
    maturin = shutil.which("maturin", path=str(Path(sys.executable).parent))
    if maturin is None:
        pytest.skip("maturin is not installed in the test venv (scripts/test installs it)")
    project = Path(__file__).resolve().parents[1]
    built = subprocess.run(
        [maturin, "build", "--profile", "dev", "--out", str(tmp_path / "dist"),
         "--manifest-path", str(project / "Cargo.toml")],
        capture_output=True, text=True,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("gpulayer-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # No index: cloudpickle comes from nowhere, so the module must import without it.
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--no-deps",
                    str(wheel)], check=True)
    version = subprocess.run([str(venv / "bin" / "gpulayer"), "--version"],
                             capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("gpulayer "), version
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import gpulayer as gl; print(gl.__version__, gl.SchedulingError.__name__)"],
        capture_output=True, text=True,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.split() == [gl.__version__, "SchedulingError"]
