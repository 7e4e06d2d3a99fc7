"""OpenAI's Responses API answer from an engine's chat completion: whole, or as the
API's stream of events (``Stream``). The request is ``responses_request``'s.

The answer (``Stream``): output items, a ``reasoning`` item for reasoning the
engine kept apart, a ``message`` for the text, a ``function_call`` per tool call;
``status`` ``incomplete`` (``max_output_tokens``) where the engine stopped at its
limit; the usage as the Responses API counts it. A stream is framed as OpenAI's:
``response.created``, ``response.in_progress``, per item ``output_item.added``,
its parts and deltas and ``output_item.done``, then ``response.completed`` (or
``response.incomplete``), each numbered by ``sequence_number``.
"""

import time

from .common import Framing, chat_tokens, choice_of, new_id, reasoning_of, sse


def usage_of(usage: dict | None, pieces: int = 0) -> dict:
    """The Responses API's usage from a chat answer's (its input counts the cached part
    too). Without the engine's usage (llama-cpp-python's streams have none), the pieces
    of output streamed, and no prompt count (0)."""
    prompt, completion, cached = chat_tokens(usage)
    prompt = prompt or 0
    completion = completion if completion is not None else pieces
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _status(choice: dict | None) -> tuple[str, dict | None]:
    finish = (choice or {}).get("finish_reason")
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class Stream(Framing):
    """A response object, whole or as its stream of events."""

    api = "responses"

    def __init__(self, req):
        super().__init__(req)
        self.started = False
        self.id = new_id("resp_")
        self.created = int(time.time())
        self.model = req.model
        self.seq = 0
        self.output: list[dict] = []  # the items, in order; the last may be open
        self.open: dict | None = None  # the open item
        self.text = ""  # the open item's text (a message's, a reasoning's)
        self.calls: dict[int, int] = {}  # the chat's tool call index -> its output index
        self.choice: dict | None = None

    def _response(self, status: str, incomplete=None, usage=None, error=None, output=None) -> dict:
        body = self.req.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "model": self.model,
            "output": list(self.output if output is None else output),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "store": False,
            "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "truncation": body.get("truncation") or "disabled",
            "usage": usage,
            "user": body.get("user"),
        }

    def answer(self, chat: dict) -> dict:
        self.id = new_id("resp_", chat.get("id"))
        self.model = chat.get("model") or self.model
        choice = choice_of(chat) or {}
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        status, incomplete = _status(choice)
        output = []
        if reasoning := reasoning_of(message):
            output.append(
                {
                    "id": new_id("rs_"),
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": reasoning}],
                    "status": status,
                }
            )
        calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
        text = message.get("content")
        if (isinstance(text, str) and text) or not calls:
            output.append(
                {
                    "id": new_id("msg_"),
                    "type": "message",
                    "status": status,
                    "role": "assistant",
                    "content": [_text_part(text if isinstance(text, str) else "")],
                }
            )
        for call in calls:
            fn = call.get("function") or {}
            output.append(
                {
                    "id": new_id("fc_"),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": call.get("id") or new_id("call_"),
                    "name": fn.get("name"),
                    "arguments": fn.get("arguments") or "",
                }
            )
        return self._response(status, incomplete, usage_of(chat.get("usage")), output=output)

    # -- a stream -------------------------------------------------------------------

    def _event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return sse(kind, data)

    def _start(self, event: dict) -> bytes:
        self.started = True
        if event.get("id"):
            self.id = new_id("resp_", event["id"])
        self.model = event.get("model") or self.model
        created = self._response("in_progress")
        return self._event("response.created", response=created) + self._event(
            "response.in_progress", response=created
        )

    def _close(self, status: str = "completed") -> bytes:
        item, self.open = self.open, None
        if item is None:
            return b""
        at = len(self.output) - 1
        kind, text = item["type"], self.text
        out = []
        if kind == "message":
            part = _text_part(text)
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    part=part,
                )
            )
            item.update(status=status, content=[part])
        elif kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            out.append(
                self._event(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    text=text,
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    part=part,
                )
            )
            item.update(status=status, content=[part])
        else:
            item["status"] = "completed"
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=at,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        self.output[at] = item
        out.append(self._event("response.output_item.done", output_index=at, item=item))
        return b"".join(out)

    def _open(self, item: dict, part: dict | None = None) -> bytes:
        out = [self._close()]
        self.output.append(item)
        self.open, self.text = item, ""
        at = len(self.output) - 1
        out.append(self._event("response.output_item.added", output_index=at, item=dict(item)))
        if part is not None:
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    part=part,
                )
            )
        return b"".join(out)

    def chunk(self, event: dict) -> bytes:
        self.take_usage(event)
        out = [] if self.started else [self._start(event)]
        choice = choice_of(event)
        if choice is None:
            return b"".join(out)
        if choice.get("finish_reason") is not None:
            self.choice = choice
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        if reasoning := reasoning_of(delta):
            if self.open is None or self.open["type"] != "reasoning":
                item = {"id": new_id("rs_"), "type": "reasoning", "summary": [], "content": []}
                out.append(self._open(item, {"type": "reasoning_text", "text": ""}))
            self.text += reasoning
            self.pieces += 1
            out.append(self._delta("response.reasoning_text.delta", reasoning, content_index=0))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self.open is None or self.open["type"] != "message":
                item = {
                    "id": new_id("msg_"),
                    "type": "message",
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                }
                out.append(self._open(item, _text_part("")))
            self.text += text
            self.pieces += 1
            out.append(
                self._delta("response.output_text.delta", text, content_index=0, logprobs=[])
            )
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            at = call.get("index", 0)
            if at not in self.calls:
                item = {
                    "id": new_id("fc_"),
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": call.get("id") or new_id("call_"),
                    "name": fn.get("name") or "",
                    "arguments": "",
                }
                out.append(self._open(item))
                self.calls[at] = len(self.output) - 1
            arguments = fn.get("arguments")
            if isinstance(arguments, str) and arguments:
                index = self.calls[at]
                self.output[index]["arguments"] += arguments
                self.pieces += 1
                out.append(
                    self._delta("response.function_call_arguments.delta", arguments, at=index)
                )
        return b"".join(out)

    def _delta(self, name: str, delta: str, at: int | None = None, **fields) -> bytes:
        at = len(self.output) - 1 if at is None else at
        return self._event(
            name, item_id=self.output[at]["id"], output_index=at, delta=delta, **fields
        )

    def finish(self) -> bytes:
        out = [] if self.started else [self._start({})]
        status, incomplete = _status(self.choice)
        if not self.output:  # an empty answer is still one message, as OpenAI's are
            item = {
                "id": new_id("msg_"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            out.append(self._open(item, _text_part("")))
        out.append(self._close(status))
        final = self._response(status, incomplete, usage_of(self.usage, self.pieces))
        name = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._event(name, response=final))
        self.ended = True
        return b"".join(out)

    def fail(self, message: str, code: str = "upstream_error", status: int = 502) -> bytes:
        """The Responses API's ``error`` event, then ``response.failed`` where this stream
        is the gateway's own (translated, or nothing sent yet); after an engine's own
        events, the ``error`` alone (its response id is the engine's)."""
        self.ended = True
        error = self._event("error", code=code, message=message, param=None)
        if self.passed and not self.started:
            return error
        out = [] if self.started else [self._start({})]
        if self.open is not None:
            out.append(self._close("incomplete"))
        failed = self._response("failed", error={"code": "server_error", "message": message})
        return b"".join([*out, error, self._event("response.failed", response=failed)])
