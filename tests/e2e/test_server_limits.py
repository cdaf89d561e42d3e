"""The server's limits, on ``turnout serve`` as a process: too many connections get 503 at once, a
client that reads slowly holds the engine back instead of filling the gateway's memory, and an idle
connection stays open for the client's next request longer than the clients' own pools keep it."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from tests.e2e.processes import LONG_STREAM, GatewayProcess
from tests.servers import ServerThread


@pytest.fixture(scope="module")
def engine() -> Iterator[ServerThread]:
    """A llama.cpp simulator that generates as fast as it is read (time scale ~0)."""
    config = SimConfig(kind="llamacpp", model="up", time_scale=0.00001, slots=4, context_window=400_000)
    sim = ServerThread(create_sim_app(config)).start()
    try:
        yield sim
    finally:
        sim.stop()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_slow_reader_holds_the_engine_back_not_the_gateways_memory(
    engine: ServerThread, tmp_path: Path
) -> None:
    """200,000 tokens (~25 MB of events) asked for, 64 KiB read, then nothing for 3 s: the gateway's
    memory stays flat (backpressure: uvicorn waits for the socket, turnout stops reading the engine)."""
    gateway = GatewayProcess(engine.url, tmp_path, {})
    try:
        with socket.create_connection(("127.0.0.1", gateway.port)) as conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            body = httpx.Request("POST", gateway.url + "/v1/chat/completions",
                                 json={**LONG_STREAM, "max_tokens": 200_000})  # fmt: skip
            head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            conn.sendall(f"{head}content-length: {len(body.content)}\r\n\r\n".encode() + body.content)
            received = 0
            while received < 65536:
                received += len(conn.recv(4096))
            before = rss_bytes(gateway.process.pid)
            time.sleep(3)  # not reading: the engine could have sent all of it by now
            after = rss_bytes(gateway.process.pid)
        assert after - before < 8 << 20, f"the gateway grew {(after - before) >> 20} MiB"
    finally:
        gateway.process.kill()
        gateway.process.wait()


def test_connections_over_the_limit_get_503_at_once(engine: ServerThread, tmp_path: Path) -> None:
    gateway = GatewayProcess(engine.url, tmp_path, {"max_connections": 2})
    held: list[socket.socket] = []
    try:
        for _ in range(2):  # two connections in use (requests whose bodies never come)
            conn = socket.create_connection(("127.0.0.1", gateway.port))
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 10\r\n\r\n")
            held.append(conn)
        deadline = time.monotonic() + 30  # the server takes the two connections in its own time
        while True:
            started = time.monotonic()
            refused = httpx.get(gateway.url + "/health", timeout=30)
            took = time.monotonic() - started
            if refused.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert refused.status_code == 503
        assert took < 10  # refused at once, not after the held requests' 30 s body timeout
    finally:
        for conn in held:
            conn.close()
        gateway.process.kill()
        gateway.process.wait()


@contextmanager
def after_one_answer(gateway: GatewayProcess) -> Iterator[http.client.HTTPConnection]:
    """A kept-alive connection to the gateway that ``/health`` has just been answered on."""
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    try:
        conn.request("GET", "/health")
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 200
        yield conn
    finally:
        conn.close()


def test_an_idle_connection_outlives_the_clients_own_pools(engine: ServerThread, tmp_path: Path) -> None:
    """An agent comes back after some seconds of tool calls on the connection its pool kept (httpx
    and the SDKs keep one 5 s): the gateway still has it open past uvicorn's own 5 s, so the request
    is not sent down a connection being closed (limits.keep_alive_s, 120 s by default)."""
    gateway = GatewayProcess(engine.url, tmp_path, {})
    try:
        with after_one_answer(gateway) as conn:
            sock = conn.sock
            time.sleep(6.0)
            conn.request("GET", "/health")  # http.client raises here if the gateway closed it
            again = conn.getresponse()
            again.read()
            assert (again.status, conn.sock is sock) == (200, True)
    finally:
        gateway.process.kill()
        gateway.process.wait()


def test_keep_alive_is_the_configured_one(engine: ServerThread, tmp_path: Path) -> None:
    """Configured to 1 s, the gateway closes an idle connection before uvicorn's own 5 s would."""
    gateway = GatewayProcess(engine.url, tmp_path, {"keep_alive_s": 1})
    try:
        with after_one_answer(gateway) as conn:
            assert conn.sock is not None
            conn.sock.settimeout(4.0)  # a busy machine may be late by a second or two, not by 4 s
            assert conn.sock.recv(1) == b""  # the gateway closed it, before uvicorn's own 5 s
    finally:
        gateway.process.kill()
        gateway.process.wait()
