"""The multi-node llama.cpp leader starts only once every follower's rpc-server listens."""

import socket
import subprocess
import sys

from agentd import rpcwait
from tests.processes import free_port

WAIT = [sys.executable, rpcwait.__file__]  # as the agent runs it: by its path
LEADER = [sys.executable, "-c", "print('leader started')"]


def test_the_leader_starts_once_every_rpc_server_listens():
    with (
        socket.create_server(("127.0.0.1", 0)) as one,
        socket.create_server(("127.0.0.1", 0)) as two,
    ):
        peers = [f"127.0.0.1:{s.getsockname()[1]}" for s in (one, two)]
        done = subprocess.run(
            [*WAIT, "--timeout", "30", *peers, "--", *LEADER],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "leader started"


def test_an_rpc_server_that_never_listens_fails_the_start_naming_it():
    silent = f"127.0.0.1:{free_port()}"
    done = subprocess.run(
        [*WAIT, "--timeout", "0.5", silent, "--", *LEADER],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"ggml-rpc-server at {silent} did not listen within 0.5 s" in done.stdout
    assert "leader started" not in done.stdout
