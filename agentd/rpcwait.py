"""Start a multi-node llama.cpp leader once its followers listen.

``python agentd/rpcwait.py [--timeout S] HOST:PORT ... -- llama-server ...``
waits until every follower's ggml-rpc-server accepts a connection, then
replaces itself with the command (same pid, so the agent watches the server
itself). llama-server connects to its RPC servers once, as it starts, and
exits if one is not there yet; followers are started at the same moment as
the leader, on other nodes, so the leader waits for them here, within the
group's startup timeout.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def _listens(peer: str) -> bool:
    host, _, port = peer.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
            return True
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: rpcwait.py [--timeout S] HOST:PORT ... -- COMMAND", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="rpcwait.py")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("peers", nargs="+")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        print("rpcwait: no command after --", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout
    waiting = list(args.peers)
    print(f"llmgw: waiting for ggml-rpc-server at {', '.join(waiting)}", flush=True)
    while waiting:
        waiting = [p for p in waiting if not _listens(p)]
        if not waiting:
            break
        if time.monotonic() > deadline:
            print(
                f"llmgw: ggml-rpc-server at {', '.join(waiting)} did not listen within "
                f"{args.timeout:g} s",
                flush=True,
            )
            return 1
        time.sleep(0.2)
    print("llmgw: every rpc-server listens; starting the leader", flush=True)
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
