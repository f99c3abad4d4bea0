"""A real GPUlayer server (embedded PostgreSQL) and real workers for the package's tests,
started with the `gpulayer` command this package installs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest

BIN = shutil.which("gpulayer", path=os.path.dirname(sys.executable)) or "gpulayer"


class Server:
    """`gpulayer up` in a temporary directory, and `gpulayer join` workers of it."""

    def __init__(
        self,
        with_worker: bool = True,
        slots: int = 4,
        lease_seconds: Optional[int] = None,
        env: Optional[Dict[str, str]] = None,
    ) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="gpulayer-pytest-"))
        self.env = dict(os.environ, XDG_CONFIG_HOME=str(self.home / "config"), GPULAYER_LOG="warn")
        self.env.update(env or {})
        for k in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_FINGERPRINT"):
            self.env.pop(k, None)
        argv = [BIN, "up", "--json", "--listen", "127.0.0.1:0", "--data-dir", str(self.home / "data")]
        if lease_seconds is not None:
            argv += ["--lease-seconds", str(lease_seconds)]
        if with_worker:
            argv += ["--with-worker", "--worker-slots", str(slots), "--worker-python", sys.executable]
        self.up = subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE, text=True)
        line = self.up.stdout.readline() if self.up.stdout else ""
        if not line:
            raise RuntimeError(f"`gpulayer up` did not start (exit {self.up.wait()})")
        ready = json.loads(line)
        self.url: str = ready["url"]
        # The server's certificate: pinned by the CLI and the package through its
        # fingerprint, trusted by plain Python HTTP clients as a CA file.
        self.fingerprint: Optional[str] = ready["fingerprint"]
        self.certificate: Optional[str] = ready["tls_certificate"]
        if self.fingerprint:
            self.env["GPULAYER_FINGERPRINT"] = self.fingerprint
        self.token: str = ready["admin_token"]
        self.join_token: str = ready["join_token"]
        self.workers: Dict[str, subprocess.Popen] = {}
        if with_worker:
            self.wait_for_workers(1)

    def join(self, name: str, slots: int = 2, inventory: Optional[dict] = None) -> subprocess.Popen:
        argv = [BIN, "join", self.url, "--token", self.join_token, "--name", name,
                "--slots", str(slots), "--work-dir", str(self.home / f"w-{name}"),
                "--python", sys.executable]
        if inventory is not None:
            path = self.home / f"{name}.inventory.json"
            path.write_text(json.dumps(inventory))
            argv += ["--inventory", str(path)]
        proc = subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL)
        self.workers[name] = proc
        return proc

    def ssl_context(self) -> "ssl.SSLContext":
        """A context that trusts this server's certificate (for httpx and the like)."""
        import ssl

        return ssl.create_default_context(cafile=self.certificate)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([BIN, *args], env=self.env, capture_output=True, text=True)

    def wait_for_workers(self, n: int, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = self.cli("workers", "--json")
            if out.returncode == 0:
                online = [w for w in json.loads(out.stdout)["workers"] if w["state"] == "online"]
                if len(online) >= n:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"fewer than {n} workers online after {timeout} s")

    def close(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.up.send_signal(signal.SIGTERM)
        try:
            self.up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.up.kill()
        # Under root the embedded cluster may live outside the temp dir; remove it too.
        pointer = self.home / "data" / "postgres" / "cluster.path"
        if pointer.exists():
            cluster = pointer.read_text().strip()
            if not cluster.startswith(str(self.home)):
                shutil.rmtree(cluster, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)


def _connected(server: Server) -> Server:
    import gpulayer as gl

    gl.connect(server.url, server.token, server.fingerprint)
    return server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """A server with one worker in the same process (4 slots, this interpreter)."""
    s = Server(with_worker=True)
    try:
        yield _connected(s)
    finally:
        s.close()


@pytest.fixture
def bare_server() -> Iterator[Server]:
    """A server without workers (the test joins its own) that declares a silent worker lost
    after 3 s."""
    s = Server(with_worker=False, lease_seconds=3)
    try:
        yield _connected(s)
    finally:
        s.close()

