"""A property-based fuzz run of the REST API from its own OpenAPI document (schemathesis):
thousands of generated and mutated requests to every operation, with an admin token, and
not one answer may be a server error (5xx)."""

import os
import shutil
import subprocess
import sys

import pytest

SCHEMATHESIS = shutil.which("schemathesis", path=os.path.dirname(sys.executable))


@pytest.mark.skipif(SCHEMATHESIS is None, reason="schemathesis is not installed (scripts/test installs it)")
def test_fuzzing_every_operation_from_the_openapi_document_finds_no_server_error(bare_server, tmp_path):
    # No worker: nothing a generated job asks for ever runs.
    out = subprocess.run(
        [SCHEMATHESIS, "run", f"{bare_server.url}/v1/openapi.json", "--url", bare_server.url,
         "-H", f"Authorization: Bearer {bare_server.token}",
         # The server's self-signed certificate, trusted as a CA file.
         "--tls-verify", bare_server.certificate,
         "--checks", "not_a_server_error",
         # Sources and outputs are gzip bodies schemathesis cannot generate; their hostile
         # forms have tests of their own (cli/tests/it/hostile.rs).
         "--exclude-method", "PUT",
         # Revoking would let the run revoke its own token (once it has made a second admin
         # token) and spend the rest of its time refused; revocation has tests of its own
         # (cli/tests/it/tokens.rs).
         "--exclude-path", "/v1/tokens/{id}/revoke",
         "--max-examples", "30", "--seed", "1", "--workers", "2", "--max-time", "60",
         # /v1/calls/results holds a request up to 20 s by design.
         "--request-timeout", "30"],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )
    summary = out.stdout[out.stdout.rfind("SUMMARY"):]
    print(summary)  # shown with -s: how many cases ran, per phase
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Tested:" in summary, summary
    # The run really reached the endpoints: not locked out by its own token's revocation
    # (the last admin token cannot be revoked) or anything else.
    assert "Authentication failed" not in summary, summary
