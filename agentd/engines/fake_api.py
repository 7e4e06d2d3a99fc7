"""The fake engine's HTTP surface: what it answers, in vLLM's dialect.

``FakeApi`` serves /health, /metrics, /v1/models, completions and chat completions
(streamed or not), embeddings, rerank and score, the runtime LoRA endpoints and,
in development mode, the sleep endpoints (``agentd.engines.fake_sleep``), with
vLLM 0.32.0's paths, statuses, bodies, metric names and stream framing
(``tests/engines/test_vllm_contract.py`` holds it to them), and counts what it
served. This module changes when that dialect changes; the process around it
(its faults, its load, the GPU memory it holds) is ``agentd.engines.fake_process``
and its command line ``agentd.engines.fake``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import time

from agentd.engines import fake_sleep

# JSON as vLLM writes it (pydantic's): no spaces, text as it is.
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

WORDS = "the quick brown fox jumps over a lazy dog while seven tired engines hum".split()


class FakeApi:
    """One fake engine's HTTP server and what it counts; ``ready`` once it has loaded."""

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
        scores = [overlap(a, b) for a, b in zip(firsts, seconds, strict=True)]
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


def overlap(query: str, document: str) -> float:
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
