"""The gateway tests' OpenAI-shaped upstream on loopback.

``Upstream`` is a real HTTP server (aiohttp) on its own thread and event loop,
so the test's own loop, a synchronous openai client and a web process can
all talk to it. Its ``mode`` forces the faults a test needs.
"""

import asyncio
import json
import socket
import threading
import time

from aiohttp import web

TOKENS = ["Hello", ",", " fleet", "!"]


class Upstream:
    def __init__(self, name: str = "up", mode: str = "ok", token_delay: float = 0.0):
        self.name = name
        # ok | garbage | close_early | status503 | status500_third (every third request)
        # | hang | not_json | deep_error
        # | prompt_logprobs (vLLM's: the prompt's tokens after the usage)
        self.mode = mode
        self.token_delay = token_delay
        self.usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        self.tokens = TOKENS  # what a stream sends, one event each
        # Bound here and handed to aiohttp, so no other process can take the port
        # between choosing it and listening on it (a port that was free a moment
        # earlier was taken once in CI: "address already in use").
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self.served = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.cancelled = 0
        self.requests: list[dict] = []
        self.paths: list[str] = []  # the path of each request, beside its body
        self.release = threading.Event()  # lets "hang" requests finish
        self.waiting: int | None = None  # what /metrics says is queued, as vLLM says it
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("test upstream did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 << 20)  # as large as engines take
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        # As vLLM serves them itself (vllm/entrypoints/anthropic, .../openai/responses):
        # for the gateway's pass-through to an engine of kind "vllm".
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.SockSite(self._runner, self._sock)
        self._loop.run_until_complete(site.start())
        self._started.set()
        self._loop.run_forever()

    def stop(self) -> None:
        """Close the listening socket and every connection, as a killed engine would."""
        if not self._loop.is_running():
            return
        self.release.set()
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        try:
            fut.result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _metrics(self, request):
        if self.waiting is None:
            raise web.HTTPNotFound()
        return web.Response(
            text="# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{self.name}"}} {self.waiting}.0\n'
            'vllm:num_requests_running{model_name="x"} 3.0\n'
        )

    async def _enter(self, request) -> dict:
        body = await request.json()
        self.requests.append(body)
        self.paths.append(request.path)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return body

    async def _wait_release(self) -> None:
        while not self.release.is_set():
            await asyncio.sleep(0.01)

    async def _guard(self, request, handler):
        body = await self._enter(request)
        try:
            if self.mode == "status503":
                return web.json_response({"detail": "engine overloaded"}, status=503)
            if self.mode == "status500_third" and len(self.requests) % 3 == 0:
                return web.json_response({"detail": "CUDA error"}, status=500)
            if self.mode == "hang":
                await self._wait_release()
            elif self.token_delay and not body.get("stream"):
                await asyncio.sleep(self.token_delay * len(TOKENS))
            resp = await handler(request, body)
            self.served += 1
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    async def _chat(self, request):
        return await self._guard(request, self._chat_answer)

    async def _messages(self, request):
        return await self._guard(request, self._messages_answer)

    async def _responses(self, request):
        return await self._guard(request, self._responses_answer)

    async def _messages_answer(self, request, body):
        """Anthropic's Messages API, as vLLM 0.32 answers it (its usage in both events)."""
        usage = {"input_tokens": 3, "output_tokens": 4}
        message = {
            "id": f"msg_{self.name}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "".join(TOKENS)}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(message)
        events = [
            (
                "message_start",
                {
                    **message,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 3, "output_tokens": 0},
                },
            ),
            ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            *[
                ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": t}})
                for t in self.tokens
            ],
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": usage},
            ),
            ("message_stop", {}),
        ]
        framed = [
            (n, {"type": n, "message": d} if n == "message_start" else {"type": n, **d})
            for n, d in events
        ]
        return await self._named_events(request, framed)

    async def _responses_answer(self, request, body):
        """OpenAI's Responses API, as vLLM 0.32 answers it (no [DONE] after the last event)."""
        text = "".join(TOKENS)
        item = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        usage = {
            "input_tokens": 3,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 4,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 7,
        }
        response = {
            "id": f"resp_{self.name}",
            "object": "response",
            "created_at": int(time.time()),
            "model": body["model"],
            "status": "completed",
            "output": [item],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(response)
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [
            ("response.created", {"response": started}),
            (
                "response.output_item.added",
                {"output_index": 0, "item": {**item, "status": "in_progress", "content": []}},
            ),
            (
                "response.content_part.added",
                {
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                },
            ),
            *[
                (
                    "response.output_text.delta",
                    {
                        "item_id": "msg_1",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": t,
                        "logprobs": [],
                    },
                )
                for t in self.tokens
            ],
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": response}),
        ]
        framed = [(n, {"type": n, **d, "sequence_number": i}) for i, (n, d) in enumerate(events)]
        return await self._named_events(request, framed)

    async def _named_events(self, request, events):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for name, data in events:
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
            await resp.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        await resp.write_eof()
        return resp

    async def _completions(self, request):
        return await self._guard(request, self._completion_answer)

    async def _embeddings(self, request):
        async def answer(request, body):
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            return web.json_response(
                {
                    "object": "list",
                    "model": body["model"],
                    "data": [
                        {"object": "embedding", "index": i, "embedding": [0.25, -0.5, float(i)]}
                        for i in range(len(inputs))
                    ],
                    "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
                }
            )

        return await self._guard(request, answer)

    async def _chat_answer(self, request, body):
        if body.get("stream"):
            return await self._stream(request, body, chat=True)
        if self.mode == "not_json":
            return web.Response(text="<html>oops</html>", content_type="application/json")
        if self.mode == "deep_error":  # an error body nested deeper than Python's stack
            deep = "[" * 100_000 + "]" * 100_000
            return web.Response(status=500, text=deep, content_type="application/json")
        answer = {
            "id": f"chatcmpl-{self.name}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(TOKENS)},
                    "finish_reason": "stop",
                }
            ],
            "usage": self.usage,
        }
        if self.mode == "prompt_logprobs":
            # As vLLM writes it: after the usage, each prompt token with its logprob.
            words = " ".join(str(m.get("content")) for m in body["messages"]).split()
            answer["prompt_logprobs"] = [None] + [
                {str(1000 + i): {"logprob": -1.5, "rank": 1, "decoded_token": w}}
                for i, w in enumerate(words)
            ]
        return web.json_response(answer, headers={"x-served-by": self.name})

    async def _completion_answer(self, request, body):
        if body.get("stream"):
            return await self._stream(request, body, chat=False)
        return web.json_response(
            {
                "id": f"cmpl-{self.name}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {"index": 0, "text": "".join(TOKENS), "finish_reason": "stop", "logprobs": None}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            }
        )

    async def _stream(self, request, body, chat: bool):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, tok in enumerate(self.tokens):
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
            if chat:
                chunk = {
                    "id": f"chatcmpl-{self.name}",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{"index": 0, "delta": {"content": tok}, "finish_reason": None}],
                }
            else:
                chunk = {
                    "id": f"cmpl-{self.name}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{"index": 0, "text": tok, "finish_reason": None}],
                }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if i == 1 and self.mode == "garbage":
                await resp.write(b"<html>502 Bad Gateway</html>\n")
            if i == 1 and self.mode == "close_early":
                # Half an event, then the connection goes: an engine that crashed.
                await resp.write(b'data: {"id": "x", "choi')
                request.transport.close()
                return resp
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            # As vLLM and OpenAI do: one last event with no choices, only usage.
            last = {
                "id": f"chatcmpl-{self.name}",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [],
                "usage": self.usage,
            }
            await resp.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
