"""llama.cpp: ``llama-server -m MODEL ...``, or llama-cpp-python's ``python -m llama_cpp.server``.

Which of the two runs: the binary agent.yaml names (a Python interpreter means
llama-cpp-python's server), else ``llama-server`` on PATH, else llama-cpp-python
in the agent's own Python. Flags checked against llama.cpp's tools/server/README.md
and llama-cpp-python's docs/server.md and llama_cpp/server/settings.py.

Across nodes (llama.cpp's tools/rpc/README.md): each follower runs
``ggml-rpc-server`` on 127.0.0.1 behind a relay listening on ADDR:PORT that lets
only the leader's address through (agentd.rpcrelay), and the leader
``llama-server --rpc ADDR:PORT,...``, which offloads layers to those servers as
to local GPUs. Both come from the install's environment (agentd.llamatools),
beside its Python.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from typing import TYPE_CHECKING

from agentd import rpcrelay, rpcwait
from agentd.engines.base import (
    Engine,
    EngineUnavailable,
    Launch,
    is_python,
    model_of,
    python_dist_version,
    run_capture,
    served_name,
    which,
)

_VERSION_LINE = re.compile(r"^version:\s*(.+)$", re.MULTILINE)

if TYPE_CHECKING:
    from agentd.protocol import DesiredShard, ProfileSpec


def _has_llama_cpp_server() -> bool:
    # find_spec on the top-level package does not import it (importing loads the
    # shared library, which is slow and can fail loudly).
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        os.path.exists(os.path.join(loc, "server", "__main__.py"))
        for loc in spec.submodule_search_locations
    )


class LlamaCpp(Engine):
    name = "llamacpp"
    # llama-server loads LoRA adapters with --lora at start only, and a request applies
    # one by its number ("lora": [{"id", "scale"}]); llama_cpp.server cannot, so a
    # profile with max_adapters runs llama-server (tools/server/README.md).
    adapters_at_start = True

    def flavour(self) -> tuple[str, list[str]]:
        """("server", argv prefix) for llama-server, ("python", ...) for llama_cpp.server."""
        if self.binary:
            path = which(self.binary)
            if is_python(path):
                return "python", [path, "-m", "llama_cpp.server"]
            return "server", [path]
        path = shutil.which("llama-server")
        if path:
            return "server", [path]
        if _has_llama_cpp_server():
            return "python", [sys.executable, "-m", "llama_cpp.server"]
        raise EngineUnavailable(
            "llama.cpp is not installed: no llama-server on PATH and no llama-cpp-python "
            "server in the agent's Python"
        )

    def _is_server(self) -> bool:
        try:
            return self.flavour()[0] == "server"
        except EngineUnavailable:
            return True

    @property
    def health_path(self) -> str:  # type: ignore[override]
        # llama-server's /health answers 503 while the model loads. llama_cpp.server
        # has no /health, but it loads the model before it listens, so any answer
        # from /v1/models means ready.
        return "/health" if self._is_server() else "/v1/models"

    @property
    def in_flight_series(self) -> tuple[str, ...]:  # type: ignore[override]
        # llama-server exports these with --metrics; llama_cpp.server exports nothing.
        if self._is_server():
            return ("llamacpp:requests_processing", "llamacpp:requests_deferred")
        return ()

    def command(self) -> list[str]:
        return self.flavour()[1]

    def tool(self, name: str) -> str:
        """llama-server or ggml-rpc-server built with RPC: beside the configured binary (an
        install's environment), else on PATH."""
        if self.binary:
            beside = os.path.join(os.path.dirname(which(self.binary)), name)
            if os.access(beside, os.X_OK):
                return beside
        found = shutil.which(name)
        if found:
            return found
        raise EngineUnavailable(
            f"llama.cpp across nodes needs {name} built with RPC: none beside "
            f"{self.binary or 'the agent'} nor on PATH (the agent's install of llama.cpp "
            "builds it: install.llamacpp_multinode, docs/engines.md)"
        )

    def build(self, profile: ProfileSpec, shard: DesiredShard, *, host: str, port: int) -> Launch:
        if shard.nnodes <= 1 and profile.max_adapters:
            argv = [self.tool("llama-server"), *self._server_args(profile, shard, host, port)]
            argv += [*_lora_args(shard), *profile.args]
            return Launch(argv, self.env(profile, shard))
        if shard.nnodes <= 1:
            return super().build(profile, shard, host=host, port=port)
        if len(shard.rpc_servers) != shard.nnodes - 1:
            raise EngineUnavailable(
                f"a llama.cpp replica over {shard.nnodes} nodes needs {shard.nnodes - 1} "
                f"rpc-server addresses; the control plane sent {len(shard.rpc_servers)}"
            )
        env = self.env(profile, shard)
        if shard.rank > 0:
            # rpc-server has no authentication (its README: never on an open network):
            # it listens on loopback only, and the relay in front of it, on the address
            # the leader connects to, lets the leader's address through and no other
            # (agentd.rpcrelay; docs/security.md, "rpc-server").
            rpc = [self.tool("ggml-rpc-server"), "-H", "127.0.0.1", "-p", "{port}"]
            if not shard.leader_addr:
                raise EngineUnavailable(
                    "a llama.cpp follower lets only its leader reach its rpc-server, and the "
                    "control plane sent no leader address (an older control plane?)"
                )
            bind = shard.rpc_servers[shard.rank - 1].rpartition(":")[0].strip("[]")
            relay = [sys.executable, rpcrelay.__file__, "--host", bind, "--port", str(port),
                     "--allow", shard.leader_addr, "--ready-timeout",
                     f"{shard.startup_timeout_s:g}", "--"]  # fmt: skip
            return Launch([*relay, *rpc], env)
        model, name = gguf_in(model_of(profile, shard)), served_name(profile, shard)
        layers = str(shard.gpu_layers) if shard.gpu_layers >= 0 else "all"
        argv = [self.tool("llama-server"), "-m", model, "--host", host, "--port", str(port),
                "--alias", name, "--metrics", "--rpc", ",".join(shard.rpc_servers),
                "--n-gpu-layers", layers, *_lora_args(shard), *profile.args]  # fmt: skip
        # The script by its path: engines start without the agent's import path.
        wait = [sys.executable, rpcwait.__file__, "--timeout", f"{shard.startup_timeout_s:g}"]
        return Launch([*wait, *shard.rpc_servers, "--", *argv], env)

    def version(self) -> str:
        flavour, prefix = self.flavour()
        if flavour == "python":
            return python_dist_version(prefix[0], "llama-cpp-python")
        # llama-server prints "version: 4567 (abc1234)" and then a "built with" line.
        text = run_capture(prefix + ["--version"])
        found = _VERSION_LINE.search(text)
        if not found:
            raise EngineUnavailable(f"{prefix[0]} --version printed no version line")
        return found.group(1).strip()

    def args(self, profile: ProfileSpec, shard: DesiredShard, host: str, port: int) -> list[str]:
        flavour, _ = self.flavour()
        model, name = gguf_in(model_of(profile, shard)), served_name(profile, shard)
        if flavour == "python":
            # llama_cpp.server takes its settings' field names as flags, underscores and all.
            argv = ["--model", model, "--host", host, "--port", str(port), "--model_alias", name]
            # One request at a time; by default the next one to arrive ends the stream
            # being answered early ([DONE], no finish_reason). Off: it waits its turn.
            argv += ["--interrupt_requests", "false"]
            if shard.gpu_layers >= 0:  # a share of a GPU: the layers that fit its budget
                argv += ["--n_gpu_layers", str(shard.gpu_layers)]
            return argv
        return self._server_args(profile, shard, host, port)

    def _server_args(self, profile: ProfileSpec, shard: DesiredShard, host: str, port: int):
        model, name = gguf_in(model_of(profile, shard)), served_name(profile, shard)
        # --metrics turns on /metrics, which drain reads for requests in flight.
        argv = ["-m", model, "--host", host, "--port", str(port), "--alias", name, "--metrics"]
        if shard.gpu_layers >= 0:
            argv += ["--n-gpu-layers", str(shard.gpu_layers)]
        return argv


def _lora_args(shard: DesiredShard) -> list[str]:
    """The adapters (``source`` is each one's local path by now: agentd.adapters), numbered
    in this order, in one comma-separated --lora: given twice, the server warns that only
    the last counts. A request without "lora" gets every adapter at the server's own
    scales, so the gateway names them in every request (fleet.gateway.table)."""
    if not shard.adapters:
        return []
    paths = ",".join(gguf_in(adapter.source) for adapter in shard.adapters)
    return ["--lora", paths, "--lora-init-without-apply"]


_PART = re.compile(r"-(\d+)-of-\d+\.gguf$")


def _first_part(name: str) -> bool:
    m = _PART.search(name)
    return m is None or int(m.group(1)) == 1


def gguf_in(model: str) -> str:
    """llama.cpp loads one file: a directory (a fetched hub repository) must hold one .gguf.

    A multi-part GGUF names its first part (``-00001-of-``), from which llama.cpp
    finds the rest.
    """
    if not os.path.isdir(model):
        return model
    found = sorted(
        os.path.relpath(os.path.join(d, f), model)
        for d, _dirs, files in os.walk(model)
        for f in files
        if f.endswith(".gguf") and _first_part(f)
    )
    if len(found) == 1:
        return os.path.join(model, found[0])
    if not found:
        raise EngineUnavailable(f"{model} holds no .gguf file for llama.cpp to load")
    raise EngineUnavailable(
        f"{model} holds {len(found)} .gguf files ({', '.join(found[:5])}); llama.cpp loads "
        "one: name that file as the profile's model_path (of a hub repository: "
        "hf://<org>/<name>/<path of the file>[@<revision>])"
    )
