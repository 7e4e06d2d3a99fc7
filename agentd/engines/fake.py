"""A fake engine for fault tests and benchmarks: ``python -m agentd.engines.fake --port P``.

An OpenAI-compatible HTTP server with no model behind it, whose faults can be
ordered on the command line: a slow load (``--load-time``), a crash
(``--crash-after``), a hang (``--hang``: it accepts connections, never answers,
and ignores SIGTERM), a 500 to every Nth completion (``--fail-every``), slow
tokens (``--token-delay``), a weight download that makes progress (``--fetch-to``),
a worker child in its process group (``--spawn-worker``), and a flood of log
lines on stdout (``--log-flood``).
Under the NVML double (``LLMGW_FAKE_NVML``) it holds GPU memory on the GPUs in
CUDA_VISIBLE_DEVICES while it runs, as vLLM does: ``--gpu-memory-utilization``
of each GPU's total, or ``--gpu-memory-bytes`` on each; where a GPU has not that
much free it fails to start as vLLM does (exit 1). It
answers /health (503 while loading), /v1/models, /v1/chat/completions and
/v1/completions (streamed or not), /v1/embeddings, /v1/rerank and /v1/score (as
vLLM serves them for a scoring model, here for any) and /metrics, and loads LoRA
adapters while it runs (/v1/load_lora_adapter and /v1/unload_lora_adapter; a
loaded adapter is listed and answers under its own name). With
VLLM_SERVER_DEV_MODE=1 it also sleeps and wakes through vLLM's endpoints
(/sleep, /wake_up, /is_sleeping, /collective_rpc), releasing its memory where
it runs with ``--enable-sleep-mode`` (``agentd.engines.fake_sleep``). Plain asyncio,
no dependencies, so it is also the gateway benchmark's stub. Use the real
llama.cpp engine wherever a real engine will do.

It speaks vLLM's dialect of what llmgw reads from an engine: the metric names
and labels (``vllm:num_requests_running{engine,model_name}`` and the rest), the
LoRA endpoints' status codes and error bodies, /v1/models' ``root`` and
``parent``, the usage objects and the stream's framing, the sleep endpoints. That dialect is held to
vLLM 0.32.0 by ``tests/engines/test_vllm_contract.py``, which sends the same
requests to both; change the two together. Its own ``fake:`` series
(``fake:requests_running``, ``fake:requests_total``,
``fake:requests_cancelled_total``, ``fake:gpu_memory_bytes``,
``fake:host_memory_bytes``) are extra, for tests.

The agent runs it only where agent.yaml names a Python for the ``fake`` engine.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agentd.engines import fake_sleep
from agentd.engines.base import Engine, served_name, which
from agentd.engines.vllm import VLLM

_AGENTD_ROOT = str(Path(__file__).resolve().parent.parent.parent)

if TYPE_CHECKING:
    from agentd.protocol import DesiredShard, ProfileSpec


class FakeEngine(Engine):
    name = "fake"
    opt_in = True
    # It speaks vLLM's dialect (the module's docstring): read as vLLM is read.
    in_flight_series = VLLM.in_flight_series
    adapter_api = VLLM.adapter_api
    # vLLM's sleep API, with or without GPUs: the fake stands in where vLLM's sleep
    # mode cannot run (Engine.sleeps_in_place, not VLLM's, which wants GPUs).
    sleep_api = True
    sleep_call = VLLM.sleep_call
    wake_call = VLLM.wake_call
    wake_calls = VLLM.wake_calls

    def command(self) -> list[str]:
        return [which(self.binary or sys.executable), "-m", "agentd.engines.fake"]

    def version(self) -> str:
        from agentd import __version__

        which(self.binary or sys.executable)  # the Python named for it must exist
        return __version__  # the fake ships with the agent

    def env(self, profile: ProfileSpec, shard: DesiredShard) -> dict[str, str]:
        env = super().env(profile, shard)
        # The engine is a module of the agent; the agent need not be installed.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_AGENTD_ROOT, os.environ.get("PYTHONPATH", "")) if p
        )
        if self.sleeps_in_place(shard):
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env

    def args(self, profile: ProfileSpec, shard: DesiredShard, host: str, port: int) -> list[str]:
        argv = ["--host", host, "--port", str(port)]
        argv += ["--served-model-name", served_name(profile, shard)]
        if shard.gpu_memory_fraction:
            argv += ["--gpu-memory-utilization", f"{shard.gpu_memory_fraction:.4f}"]
        if self.sleeps_in_place(shard):
            argv.append("--enable-sleep-mode")
        return argv


# ---- the server ---------------------------------------------------------------

# JSON as vLLM writes it (pydantic's): no spaces, text as it is.
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

WORDS = "the quick brown fox jumps over a lazy dog while seven tired engines hum".split()


class FakeServer:
    def __init__(self, opts: argparse.Namespace):
        self.opts = opts
        self.ready = False
        self.running = 0  # requests in flight
        self.served = 0
        self.cancelled = 0
        self.completions = 0  # asked for, failed ones too (--fail-every)
        self.prompt_tokens = 0  # vllm:prefix_cache_queries_total: none of them is ever a hit
        self.adapters: dict[str, str] = {}  # LoRA adapters loaded: name -> path
        self.dev_mode = fake_sleep.dev_mode()  # vLLM's development endpoints are served
        self.sleep = fake_sleep.Sleep(opts.enable_sleep_mode, opts.wake_time, opts.load_time)

    # -- HTTP plumbing ---------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, version = (lines[0].split(" ") + ["", "", ""])[:3]
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                if self.opts.hang:
                    await asyncio.Event().wait()  # accepted, never answered
                path, _, query = path.partition("?")
                await self.route(method, path, body, writer, keep, query)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def send(self, writer, status: int, payload, keep: bool, ctype="application/json"):
        body = payload if isinstance(payload, bytes) else dumps(payload).encode()
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            500: "Internal Server Error",
            503: "Service Unavailable",
        }
        writer.write(
            (
                f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
            ).encode()
            + body
        )
        await writer.drain()

    @staticmethod
    def error(message: str, kind: str, status: int, param: str | None = None) -> dict:
        """vLLM's error body: its exception's name as the type, the status as the code."""
        return {"error": {"message": message, "type": kind, "param": param, "code": status}}

    def metrics(self) -> bytes:
        """vLLM's series that llmgw reads, with vLLM's labels, then the fake's own."""
        labels = f'{{engine="0",model_name="{self.opts.served_model_name}"}}'
        # (name, type, value, help) in vLLM 0.32.0's words.
        series = [
            ("vllm:num_requests_running", "gauge", self.running,
             "Number of requests in model execution batches."),
            ("vllm:num_requests_waiting", "gauge", 0,
             "Number of requests waiting to be processed."),
            ("vllm:kv_cache_usage_perc", "gauge", 0,
             "KV-cache usage. 1 means 100 percent usage."),
            ("vllm:prefix_cache_queries_total", "counter", self.prompt_tokens,
             "Prefix cache queries, in terms of number of queried tokens."),
            ("vllm:prefix_cache_hits_total", "counter", 0,
             "Prefix cache hits, in terms of number of cached tokens."),
        ]  # fmt: skip
        lines = []
        for name, kind, value, about in series:
            lines += [f"# HELP {name} {about}", f"# TYPE {name} {kind}"]
            lines.append(f"{name}{labels} {float(value)}")
        lines += self.sleep.metrics(labels[1:-1])
        lines += [
            f"fake:requests_running {self.running}",
            f"fake:requests_total {self.served}",
            f"fake:requests_cancelled_total {self.cancelled}",
        ]
        return ("\n".join(lines) + "\n").encode()

    # -- routes ----------------------------------------------------------------

    async def route(
        self, method: str, path: str, body: bytes, writer, keep: bool, query: str = ""
    ) -> None:
        if self.dev_mode and path in fake_sleep.PATHS:
            if not self.ready:
                problem = self.error("the model is loading", "ServiceUnavailable", 503)
                return await self.send(writer, 503, problem, keep)
            status, answer = await self.sleep.route(method, path, query, body, lambda: self.running)
            return await self.send(writer, status, answer, keep)
        if path == "/health":
            # vLLM answers 200 with an empty body once it serves.
            status = 200 if self.ready else 503
            return await self.send(writer, status, b"" if self.ready else b"loading", keep)
        if path == "/metrics":
            ctype = "text/plain; version=1.0.0; charset=utf-8"
            return await self.send(writer, 200, self.metrics(), keep, ctype)
        not_found = {"detail": "Not Found"}  # an unknown path, in FastAPI's words
        if not path.startswith("/v1/"):
            return await self.send(writer, 404, not_found, keep)
        if not self.ready:
            return await self.send(
                writer, 503, self.error("the model is loading", "ServiceUnavailable", 503), keep
            )
        if path == "/v1/models" and method == "GET":
            return await self.send(writer, 200, self.models(), keep)
        if method != "POST":
            return await self.send(writer, 404, not_found, keep)
        try:
            req = json.loads(body or b"{}")
            if not isinstance(req, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            return await self.send(
                writer, 400, self.error(f"invalid JSON body: {exc}", "BadRequestError", 400), keep
            )
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            status, answer = self.lora(path.endswith("/load_lora_adapter"), req)
            if status != 200:
                return await self.send(writer, status, answer, keep)
            return await self.send(writer, status, answer["text"].encode(), keep, "text/plain")
        if path == "/v1/embeddings":
            return await self.embeddings(req, writer, keep)
        if path in ("/v1/rerank", "/v1/score"):
            return await self.score(path == "/v1/rerank", req, writer, keep)
        if path in ("/v1/chat/completions", "/v1/completions"):
            return await self.complete(path.endswith("chat/completions"), req, writer, keep)
        return await self.send(writer, 404, not_found, keep)

    def models(self) -> dict:
        """vLLM's list: the base model's ``root`` is its weights and ``parent`` null; an
        adapter's ``root`` is its path and ``parent`` the base model's name."""
        name, created = self.opts.served_model_name, int(time.time())
        base = {"id": name, "object": "model", "created": created, "owned_by": "vllm"}
        data = [{**base, "root": self.opts.model or name, "parent": None,
                 "max_model_len": self.opts.max_model_len}]  # fmt: skip
        for adapter, where in sorted(self.adapters.items()):
            data.append({**base, "id": adapter, "root": where, "parent": name,
                         "max_model_len": None})  # fmt: skip
        return {"object": "list", "data": data}

    def lora(self, load: bool, req: dict) -> tuple[int, dict]:
        """(status, answer) as vLLM 0.32.0's runtime LoRA endpoints give them; a 200's
        answer is plain text (``answer["text"]``), the others vLLM's error body."""
        name, where = req.get("lora_name"), req.get("lora_path")
        for field, value in (("lora_name", name), ("lora_path", where if load else "")):
            if not isinstance(value, str):
                # Refused by vLLM's request model (pydantic) before the endpoint runs.
                kind, msg = (
                    ("missing", "Field required")
                    if value is None
                    else ("string_type", "Input should be a valid string")
                )
                what = {"type": kind, "loc": f"body.{field}", "msg": msg,
                        "input": f"<dict of {len(req)} items>"}  # fmt: skip
                text = f"1 validation error:\n  {what}"
                return 400, self.error(text, "Bad Request", 400, f"body.{field}")
        if not load:
            if self.adapters.pop(name, None) is None:
                text = f"The lora adapter '{name}' cannot be found."
                return 404, self.error(text, "NotFoundError", 404)
            return 200, {"text": f"Success: LoRA adapter '{name}' removed successfully."}
        if name in self.adapters:
            text = (
                f"The lora adapter '{name}' has already been loaded. If you want to load "
                "the adapter in place, set 'load_inplace' to True."
            )
            return 400, self.error(text, "InvalidUserInput", 400)
        if not os.path.exists(where):
            # vLLM writes "<path>" where the path would be: it keeps paths out of answers.
            text = f"Loading lora {name} failed: No adapter found for <path>"
            return 404, self.error(text, "NotFoundError", 404)
        self.adapters[name] = where
        return 200, {"text": f"Success: LoRA adapter '{name}' added successfully."}

    async def embeddings(self, req: dict, writer, keep: bool) -> None:
        inputs = req.get("input")
        inputs = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(inputs, list) or not inputs:
            return await self.send(
                writer,
                400,
                self.error("'input' must be a string or a list", "BadRequestError", 400),
                keep,
            )
        data = []
        for i, text in enumerate(inputs):
            digest = hashlib.sha256(str(text).encode()).digest()
            vec = [round(b / 255.0 - 0.5, 4) for b in digest[:8]]
            data.append({"object": "embedding", "index": i, "embedding": vec})
        usage = {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}
        payload = {"object": "list", "data": data, "model": self.opts.served_model_name}
        return await self.send(writer, 200, {**payload, "usage": usage}, keep)

    async def complete(self, chat: bool, req: dict, writer, keep: bool) -> None:
        n = req.get("max_tokens") or req.get("max_completion_tokens") or 16
        if not isinstance(n, int) or n < 1:
            problem = self.error("'max_tokens' must be a positive integer", "BadRequestError", 400)
            return await self.send(writer, 400, problem, keep)
        n = min(n, 4096)
        self.completions += 1
        every = self.opts.fail_every
        if every and self.completions % every == 0:
            # As an engine whose new build or flag is broken answers: a 500 with a reason.
            problem = self.error("fake engine: --fail-every", "InternalServerError", 500)
            return await self.send(writer, 500, problem, keep)
        # Asleep or paused, vLLM queues a request until the wake; a sleep with mode=abort
        # meanwhile ends it unstarted. (Its gauges do not move while it is paused: the
        # queued request is not counted as waiting.)
        epoch = self.sleep.epoch
        await self.sleep.admit.wait()
        prompt = prompt_tokens(req, chat)
        self.prompt_tokens += prompt
        rid = f"{'chatcmpl' if chat else 'cmpl'}-fake{self.served}"
        kind = "chat.completion" if chat else "text_completion"
        model = req.get("model") if req.get("model") in self.adapters else None
        base = {
            "id": rid,
            "created": int(time.time()),
            "model": model or self.opts.served_model_name,
        }
        self.running += 1
        self.served += 1
        try:
            if req.get("stream"):
                options = req.get("stream_options")
                usage = isinstance(options, dict) and options.get("include_usage") is True
                return await self.stream(chat, n, base, kind, writer, keep, usage, prompt, epoch)
            await self.sleep.step.wait()
            left = self.opts.token_delay * n
            while left > 0 and self.sleep.epoch == epoch:
                await asyncio.sleep(min(left, 0.05))  # in steps, so a sleep's abort ends it
                left -= 0.05
            # A sleep with mode=abort ended it: vLLM answers 200, finish_reason "abort" (the
            # fake, not knowing how far it got, with no text).
            aborted = self.sleep.epoch != epoch
            got = 0 if aborted else n
            text = " ".join(self.word(i) for i in range(got))
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            finish = "abort" if aborted else "length"
            usage = {
                **counts(prompt, got),
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            }
            payload = {**base, "object": kind, "choices": [{**choice, "finish_reason": finish}]}
            await self.send(writer, 200, {**payload, "usage": usage}, keep)
        finally:
            self.running -= 1

    async def stream(
        self,
        chat: bool,
        n: int,
        base: dict,
        kind: str,
        writer,
        keep: bool,
        usage: bool = False,
        prompt: int = 1,
        epoch: int = 0,
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            b"Cache-Control: no-cache\r\n"
            + (b"Transfer-Encoding: chunked\r\n" if keep else b"")
            + f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n".encode()
        )

        async def event(data: str) -> None:
            raw = f"data: {data}\n\n".encode()
            writer.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n" if keep else raw)
            await writer.drain()

        obj = kind + ".chunk" if chat else kind
        try:
            if chat:
                # vLLM's first chat event names the role and carries no text.
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                await event(dumps({**base, "object": obj, "choices": [
                    {**role, "logprobs": None, "finish_reason": None}]}))  # fmt: skip
            for i in range(n):
                await self.sleep.step.wait()  # frozen by a sleep with mode=keep
                # Ended by a sleep with mode=abort: a last event without text.
                aborted = self.sleep.epoch != epoch
                word = "" if aborted else self.word(i) + (" " if i < n - 1 else "")
                delta = {"content": word} if chat else None
                choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": word}
                last = i == n - 1 or aborted
                choice["finish_reason"] = ("abort" if aborted else "length") if last else None
                await event(dumps({**base, "object": obj, "choices": [choice]}))
                if last:
                    n = i if aborted else n
                    break
                if self.opts.token_delay:
                    await asyncio.sleep(self.opts.token_delay)
            if usage:
                # stream_options.include_usage, as vLLM answers it: a last event of usage only.
                final = {**base, "object": obj, "choices": [], "usage": counts(prompt, n)}
                await event(dumps(final))
            await event("[DONE]")
            if keep:
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except ConnectionError:
            # The client went away mid-stream: stop generating, as a real engine does.
            self.cancelled += 1
            raise

    def word(self, i: int) -> str:
        """The i-th generated token: "!" while the weights are empty memory (a wake from
        level 2 without reload_weights), as a model whose weights are zeros answers."""
        return "!" if self.sleep.stale else WORDS[i % len(WORDS)]

    # -- lifecycle -------------------------------------------------------------

    async def fetch(self) -> None:
        """Write --fetch-bytes into --fetch-to over --fetch-time, as a weight download would."""
        target = Path(self.opts.fetch_to)
        target.mkdir(parents=True, exist_ok=True)
        steps = 20
        with open(target / "weights.bin", "wb") as fh:
            for _ in range(steps):
                fh.write(b"\0" * (self.opts.fetch_bytes // steps))
                fh.flush()
                await asyncio.sleep(self.opts.fetch_time / steps)
        print(f"fake engine: fetched {self.opts.fetch_bytes} bytes into {target}", flush=True)

    def hold_gpu_memory(self) -> None:
        """Take GPU memory in the NVML double, as an engine allocates its budget on load;
        where a GPU has not that much free, fail as vLLM does (exit 1)."""
        nvml_file = os.environ.get("LLMGW_FAKE_NVML")
        uuids = [u for u in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if u]
        share, fixed = self.opts.gpu_memory_utilization, self.opts.gpu_memory_bytes
        if not nvml_file or not uuids or not (share or fixed):
            return
        from agentd import nvml_double

        totals = {
            g.get("uuid"): g.get("memory_total_bytes", 0)
            for g in json.loads(Path(nvml_file).read_text()).get("gpus", [])
        }
        held = {u: fixed or int(share * totals.get(u, 0)) for u in uuids}
        # The weights' part of each GPU's share: what a level-1 sleep keeps in host memory.
        weights = {u: min(b, self.opts.weights_bytes or b // 2) for u, b in held.items()}
        parts = {"weights": weights, "kv_cache": {u: b - weights[u] for u, b in held.items()}}
        memory = fake_sleep.Memory(Path(nvml_file), parts)
        try:
            memory.take(set(fake_sleep.TAGS))
        except nvml_double.OutOfMemory as exc:
            print(self.out_of_memory(exc, uuids.index(exc.uuid)), flush=True)
            os._exit(1)
        self.sleep.memory = memory
        print(f"fake engine: holding {held} bytes of GPU memory", flush=True)

    def out_of_memory(self, exc, device: int) -> str:
        """What vLLM prints as it fails to start on a GPU without room: its own check of
        --gpu-memory-utilization (vllm/v1/worker/utils.py), else PyTorch's failed allocation."""
        gib = 2**30
        if not self.opts.gpu_memory_bytes:
            return (
                f"ValueError: Free memory on device cuda:{device} "
                f"({round(exc.free / gib, 2)}/{round(exc.total / gib, 2)} GiB) on startup is "
                f"less than desired GPU memory utilization ({self.opts.gpu_memory_utilization}, "
                f"{round(exc.wanted / gib, 2)} GiB). Decrease GPU memory utilization or reduce "
                "GPU memory used by other processes."
            )
        return (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{exc.wanted / gib:.2f} GiB. GPU {device} has a total capacity of "
            f"{exc.total / gib:.2f} GiB of which {max(exc.free, 0) / gib:.2f} GiB is free."
        )

    async def run(self) -> None:
        opts = self.opts
        loop = asyncio.get_running_loop()
        if opts.hang:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            loop.add_signal_handler(signal.SIGTERM, lambda: os._exit(0))
        if opts.spawn_worker:
            worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"])
            print(f"fake engine: worker pid {worker.pid}", flush=True)
        if opts.crash_after is not None:
            loop.call_later(opts.crash_after, self.crash)
        if opts.fetch_to:
            await self.fetch()
        if opts.log_flood > 0:
            self.flooding = asyncio.ensure_future(self.flood_logs())  # kept: a task needs a holder
        server = await asyncio.start_server(self.handle, opts.host, opts.port)
        print(f"fake engine: pid {os.getpid()} listening on {opts.host}:{opts.port}", flush=True)
        if opts.hang:
            print("fake engine: hanging", flush=True)
        else:
            print(f"fake engine: loading for {opts.load_time:g} s", flush=True)
            self.hold_gpu_memory()
            await asyncio.sleep(opts.load_time)
            self.ready = True
            print(f"fake engine: ready, serving {opts.served_model_name}", flush=True)
        async with server:
            await server.serve_forever()

    async def flood_logs(self) -> None:
        """``--log-flood`` lines a second on stdout, as an engine logging every token would."""
        rate, written, started = self.opts.log_flood, 0, time.monotonic()
        # Each line --log-flood-line-bytes long, its newline included.
        filler = b"x" * max(0, self.opts.log_flood_line_bytes - 35)
        out = sys.stdout.buffer
        while True:
            due = int((time.monotonic() - started) * rate)
            if due > written:
                out.write(
                    b"".join(
                        b"fake engine: flood line %09d %s\n" % (i, filler)
                        for i in range(written, due)
                    )
                )
                out.flush()
                written = due
            await asyncio.sleep(0.05)

    def crash(self) -> None:
        print(f"fake engine: crashing with exit code {self.opts.exit_code}", flush=True)
        os._exit(self.opts.exit_code)

    async def score(self, rerank: bool, req: dict, writer, keep: bool) -> None:
        """vLLM 0.32.0's rerank and score answers (vllm/entrypoints/pooling/scoring/
        protocol.py): each pair of texts scored, here by the share of the first's words
        the second holds; the usage counts a token a word of each pair, as vLLM counts
        each pair's prompt."""
        if rerank:
            first, second = req.get("query"), req.get("documents")
        else:
            # Its four spellings of the two sides, vLLM's ScoreRequest.
            pairs = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                     ("text_1", "text_2"))  # fmt: skip
            one, two = next((p for p in pairs if p[0] in req and p[1] in req), (None, None))
            first, second = req.get(one), req.get(two)
        firsts = first if isinstance(first, list) else [first]
        seconds = second if isinstance(second, list) else [second]
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        texts = firsts + seconds
        if not seconds or len(firsts) != len(seconds) or not all(isinstance(t, str) for t in texts):
            what = "'query' and 'documents'" if rerank else "two sides of equal length"
            problem = self.error(
                f"{what} must be strings or lists of strings", "BadRequestError", 400
            )
            return await self.send(writer, 400, problem, keep)
        scores = [_overlap(a, b) for a, b in zip(firsts, seconds, strict=True)]
        tokens = sum(
            max(1, len(a.split()) + len(b.split())) for a, b in zip(firsts, seconds, strict=True)
        )
        self.served += 1
        if not rerank:
            data = [{"index": i, "object": "score", "score": x} for i, x in enumerate(scores)]
            payload = {
                "id": f"score-fake{self.served}",
                "object": "list",
                "created": int(time.time()),
                "model": self.opts.served_model_name,
                "data": data,
                "usage": {**counts(tokens, 0), "prompt_tokens_details": None},
            }
            return await self.send(writer, 200, payload, keep)
        results = [
            {"index": i, "document": {"text": doc, "multi_modal": None}, "relevance_score": x}
            for i, (doc, x) in enumerate(zip(seconds, scores, strict=True))
        ]
        results.sort(key=lambda r: r["relevance_score"], reverse=True)
        top_n = req.get("top_n")
        if isinstance(top_n, int) and 0 < top_n < len(results):
            results = results[:top_n]
        payload = {
            "id": f"rerank-fake{self.served}",
            "model": self.opts.served_model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results,
        }
        return await self.send(writer, 200, payload, keep)


def _overlap(query: str, document: str) -> float:
    """How much of ``query``'s words ``document`` holds, from 0 to 1."""
    words = set(query.lower().split())
    return round(len(words & set(document.lower().split())) / len(words), 4) if words else 0.0


def counts(prompt: int, completion: int) -> dict:
    """A usage object's counts, in vLLM's order."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def prompt_tokens(req: dict, chat: bool) -> int:
    """The prompt's size, a token a word (at least one): there is no tokenizer here."""
    if chat:
        messages = req.get("messages")
        parts = (
            [m.get("content") for m in messages if isinstance(m, dict)]
            if isinstance(messages, list)
            else []
        )
    else:
        prompt = req.get("prompt")
        parts = prompt if isinstance(prompt, list) else [prompt]
    return max(1, sum(len(p.split()) for p in parts if isinstance(p, str)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m agentd.engines.fake", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", default="fake")
    p.add_argument("--model", default="", help="listed as the model's root: there is no model")
    p.add_argument("--max-model-len", type=int, default=2048, help="listed in /v1/models")
    p.add_argument(
        "--load-time", type=float, default=0.0,
        help="seconds /health answers 503; also what reload_weights takes after a level-2 sleep",
    )  # fmt: skip
    p.add_argument("--crash-after", type=float, help="exit with --exit-code after this many s")
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--hang", action="store_true", help="accept, never answer, ignore SIGTERM")
    p.add_argument("--fail-every", type=int, default=0, help="answer 500 to every Nth completion")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between tokens")
    p.add_argument("--fetch-to", help="a directory to fill before listening, like a download")
    p.add_argument("--fetch-bytes", type=int, default=1 << 20)
    p.add_argument("--fetch-time", type=float, default=1.0)
    p.add_argument("--spawn-worker", action="store_true", help="a child in the same group")
    p.add_argument("--log-flood", type=float, default=0.0, help="log lines a second on stdout")
    p.add_argument(
        "--gpu-memory-utilization", type=float, default=0.0, help="share of each GPU to hold"
    )
    p.add_argument("--gpu-memory-bytes", type=int, default=0, help="bytes to hold on each GPU")
    p.add_argument(
        "--weights-bytes", type=int, default=0,
        help="of those, the weights' on each GPU (kept in host memory at level 1); default half",
    )  # fmt: skip
    p.add_argument(
        "--enable-sleep-mode", action="store_true",
        help="a sleep releases its GPU memory (the endpoints need VLLM_SERVER_DEV_MODE=1)",
    )  # fmt: skip
    p.add_argument(
        "--wake-time", type=float, default=0.05,
        help="seconds a level-1 sleep or wake takes to copy the weights",
    )  # fmt: skip
    p.add_argument("--log-flood-line-bytes", type=int, default=200, help="each flood line's size")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(FakeServer(parse_args(argv)).run())


if __name__ == "__main__":
    main()
