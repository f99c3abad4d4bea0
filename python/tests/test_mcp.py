"""GPUlayer's MCP tools driven by a real MCP client (the `mcp` Python SDK 2.x), over
Streamable HTTP (`/mcp` on the server) and over stdio (`gpulayer mcp`): resources, submit
(shipping a project directory), wait, logs, download, jobs, cancel; read-only callers are
offered only the reading tools."""

import json
import os
import subprocess

import pytest

mcp = pytest.importorskip("mcp")
httpx2 = pytest.importorskip("httpx2")

from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from conftest import BIN  # noqa: E402

pytestmark = pytest.mark.anyio

ALL_TOOLS = {"gpulayer_resources", "gpulayer_submit", "gpulayer_wait", "gpulayer_job_logs",
             "gpulayer_download_outputs", "gpulayer_jobs", "gpulayer_cancel"}
READING_TOOLS = ALL_TOOLS - {"gpulayer_submit", "gpulayer_cancel"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def http_transport(server, token):
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120,
                                verify=server.ssl_context())
    return streamable_http_client(f"{server.url}/mcp", http_client=client)


def stdio_transport(server, token, *extra):
    env = dict(os.environ, GPULAYER_URL=server.url, GPULAYER_TOKEN=token,
               GPULAYER_FINGERPRINT=server.fingerprint,
               XDG_CONFIG_HOME=str(server.home / "mcp-config"))
    return StdioServerParameters(command=BIN, args=["mcp", *extra], env=env)


def data(result):
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def make_token(server, role, name):
    out = server.cli("token", "create", "--role", role, "--name", name, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["secret"]


async def a_whole_job(client, project, downloads):
    names = {t.name for t in (await client.list_tools()).tools}
    assert names == ALL_TOOLS
    resources = data(await client.call_tool("gpulayer_resources", {}))
    assert [w["state"] for w in resources["workers"]] == ["online"]

    # Nothing could ever run it: the per-worker reasons come back, nothing is submitted.
    refused = await client.call_tool("gpulayer_submit", {"command": ["true"], "accelerator": "cuda",
                                                         "devices": 8})
    assert refused.is_error and "no eligible worker" in refused.content[0].text
    assert "cuda" in refused.content[0].text

    job = data(await client.call_tool("gpulayer_submit", {
        "command": ["python3", "make.py"], "directory": str(project), "accelerator": "cpu",
        "env": {"GREETING": "hello from mcp"}, "name": "mcp-job"}))
    assert job["name"] == "mcp-job"
    waited = data(await client.call_tool("gpulayer_wait", {"job": job["id"], "timeout_seconds": 120}))
    assert waited["still_running"] is False and waited["job"]["state"] == "succeeded", waited
    logs = data(await client.call_tool("gpulayer_job_logs", {"job": job["id"], "tail": 2}))
    assert [l["text"] for l in logs["lines"]] == ["hello from mcp", "wrote result.txt"]
    assert logs["total_lines"] >= 2
    got = data(await client.call_tool("gpulayer_download_outputs", {"job": job["id"],
                                                                    "directory": str(downloads)}))
    assert "result.txt" in got["files"]
    assert (downloads / "result.txt").read_text() == "hello from mcp\n"
    listed = data(await client.call_tool("gpulayer_jobs", {"limit": 5}))
    assert job["id"] in [j["id"] for j in listed["jobs"]]

    sleeper = data(await client.call_tool("gpulayer_submit", {"command": ["sleep", "300"],
                                                              "accelerator": "cpu"}))
    cancelled = data(await client.call_tool("gpulayer_cancel", {"job": sleeper["id"]}))
    assert cancelled["previous_state"] in ("pending", "assigned", "running")
    assert cancelled["job"]["state"] == "cancelled"
    return job["id"]


@pytest.fixture
def project(tmp_path):
    p = tmp_path / "project"
    p.mkdir()
    (p / "make.py").write_text(
        "import os\n"
        "text = os.environ['GREETING']\n"
        "print(text)\n"
        "open(os.path.join(os.environ['GPULAYER_OUTPUT_DIR'], 'result.txt'), 'w').write(text + '\\n')\n"
        "print('wrote result.txt')\n"
    )
    return p


async def test_an_agent_runs_a_whole_job_through_mcp_over_streamable_http(server, project, tmp_path):
    token = make_token(server, "submitter", "agent-http")
    async with Client(http_transport(server, token)) as client:
        # The current protocol (stateless); older clients get sessions (below).
        assert client.protocol_version == "2026-07-28"
        job = await a_whole_job(client, project, tmp_path / "out")
    status = json.loads(server.cli("status", str(job), "--json").stdout)
    assert status["submitted_by"] == "agent-http"


async def test_an_agent_runs_a_whole_job_through_gpulayer_mcp_over_stdio(server, project, tmp_path):
    token = make_token(server, "submitter", "agent-stdio")
    async with Client(stdio_transport(server, token)) as client:
        job = await a_whole_job(client, project, tmp_path / "out")
    status = json.loads(server.cli("status", str(job), "--json").stdout)
    assert status["submitted_by"] == "agent-stdio"


async def test_read_only_callers_are_offered_only_the_reading_tools(server):
    viewer = make_token(server, "read-only", "agent-viewer")
    submitter = make_token(server, "submitter", "agent-ro-mode")
    for transport in (http_transport(server, viewer), stdio_transport(server, submitter, "--read-only")):
        async with Client(transport) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == READING_TOOLS
            data(await client.call_tool("gpulayer_jobs", {}))
            # Calling one anyway is the protocol's "unknown tool" error.
            with pytest.raises(MCPError, match="gpulayer_submit is not offered to a read-only caller"):
                await client.call_tool("gpulayer_submit", {"command": ["true"]})


async def test_mcp_requests_without_a_known_token_are_refused(server):
    async with httpx2.AsyncClient(verify=server.ssl_context()) as http:
        for headers in ({}, {"Authorization": "Bearer gls_not-a-token"}):
            resp = await http.post(f"{server.url}/mcp", headers=headers,
                                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert resp.status_code == 401, resp.text


async def test_a_legacy_client_gets_a_session_and_the_same_tools(server):
    token = make_token(server, "read-only", "agent-legacy")
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}

    def message(resp):
        if resp.headers["content-type"].startswith("application/json"):
            return resp.json()
        data_lines = [l[5:].strip() for l in resp.text.splitlines() if l.startswith("data:")]
        return json.loads(next(l for l in data_lines if l))

    async with httpx2.AsyncClient(timeout=30, verify=server.ssl_context()) as http:
        init = await http.post(f"{server.url}/mcp", headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "legacy", "version": "1"}}})
        assert init.status_code == 200, init.text
        assert message(init)["result"]["protocolVersion"] == "2025-11-25"
        session = init.headers["mcp-session-id"]
        headers["Mcp-Session-Id"] = session
        note = await http.post(f"{server.url}/mcp", headers=headers,
                               json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status_code == 202, note.text
        tools = await http.post(f"{server.url}/mcp", headers=headers,
                                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert {t["name"] for t in message(tools)["result"]["tools"]} == READING_TOOLS
