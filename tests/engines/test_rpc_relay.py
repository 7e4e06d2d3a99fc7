"""A follower's ggml-rpc-server is reachable only by its leader, through the relay in front
of it (agentd/rpcrelay.py). Real processes: the relay as the agent runs it (by its path),
llama.cpp's own ggml-rpc-server and llama-server built beside the test virtualenv's
Python (the agent's install builds the same), peers on two loopback addresses."""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from agentd import rpcrelay
from agentd.engines.llamacpp import LlamaCpp
from tests.processes import free_port, pid_alive

pytestmark = pytest.mark.live

LEADER, STRANGER = "127.0.0.1", "127.0.0.2"


def wait_for(check, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


class RelayedServer:
    """The relay and its rpc-server, as a follower shard runs them; output in a file."""

    def __init__(self, tmp: Path, allow: str = LEADER):
        self.port = free_port()
        self.out = tmp / "relay.log"
        rpc = LlamaCpp(sys.executable).tool("ggml-rpc-server")
        argv = [sys.executable, rpcrelay.__file__, "--host", LEADER, "--port", str(self.port),
                "--allow", allow, "--", rpc, "-H", "127.0.0.1", "-p", "{port}"]  # fmt: skip
        with open(self.out, "wb") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)
        wait_for(lambda: "llmgw rpc relay: listening" in self.output(), "the relay listening")
        (child,) = psutil.Process(self.proc.pid).children()
        self.rpc_server = child

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def accepted(self) -> int:
        """Connections the rpc-server itself accepted."""
        return self.output().count("Accepted client connection")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture
def relayed(tmp_path):
    server = RelayedServer(tmp_path)
    yield server
    server.close()


def connect_from(source: str, port: int) -> socket.socket:
    return socket.create_connection((LEADER, port), timeout=10, source_address=(source, 0))


def test_a_peer_other_than_the_leader_is_closed_at_once_and_logged(relayed):
    # the rpc-server listens on loopback only, where the relay reaches it
    (listening,) = [c.laddr for c in relayed.rpc_server.net_connections() if c.status == "LISTEN"]
    assert listening.ip == "127.0.0.1" and listening.port != relayed.port
    before = relayed.accepted()

    # when: a peer from another address connects and speaks
    with connect_from(STRANGER, relayed.port) as s:
        s.sendall(b"\x00" * 64)
        try:
            got = s.recv(16)
        except ConnectionResetError:
            got = b""

    # then: it is closed without an answer, logged, and the rpc-server never saw it
    assert got == b""
    line = wait_for(
        lambda: [ln for ln in relayed.output().splitlines() if "refused" in ln], "the refusal"
    )
    assert line[0].startswith(f"llmgw rpc relay: refused a connection from {STRANGER}:")
    assert line[0].endswith(f": only {LEADER} may connect")
    assert relayed.accepted() == before

    # when: the leader's address connects
    with connect_from(LEADER, relayed.port):
        # then: the rpc-server accepts it
        wait_for(lambda: relayed.accepted() == before + 1, "the rpc-server to accept the leader")


def test_a_leader_serves_through_the_relay(relayed, tmp_path):
    from agentd.tinygguf import write as write_tiny_model

    model = write_tiny_model(tmp_path / "tiny.gguf")
    port = free_port()
    server = LlamaCpp(sys.executable).tool("llama-server")
    argv = [server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--rpc", f"{LEADER}:{relayed.port}", "--n-gpu-layers", "all"]  # fmt: skip
    with open(tmp_path / "leader.log", "wb") as fh:
        leader = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)
    try:
        body = json.dumps({"prompt": "the fleet", "n_predict": 8, "ignore_eos": True}).encode()

        def completion():
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body)
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return json.loads(resp.read())
            except OSError:
                assert leader.poll() is None, (tmp_path / "leader.log").read_text()
                return None

        answer = wait_for(completion, "the leader to answer", 120)
    finally:
        leader.terminate()
        leader.wait(30)

    # the layers ran on the rpc-server behind the relay
    assert answer["tokens_predicted"] == 8
    assert relayed.accepted() >= 2  # the relay's readiness probe, then the leader


def test_the_relay_ends_as_its_rpc_server_ends_and_takes_it_along(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one, two = RelayedServer(tmp_path / "one"), RelayedServer(tmp_path / "two")
    try:
        # when: an rpc-server is killed, then its relay ends by the same signal (the
        # agent reports the shard killed, as it did without the relay)
        one.rpc_server.kill()
        assert one.proc.wait(30) == -signal.SIGKILL

        # when: a relay is killed, then its rpc-server goes with it
        two.proc.kill()
        two.proc.wait(30)
        wait_for(lambda: not pid_alive(two.rpc_server.pid), "the rpc-server to end")
    finally:
        one.close()
        two.close()
