"""What an engine's answer says, read as it passes: its usage, whole or from its
events, and whether its event stream is whole and well formed (``SSECheck``).

The usage is read from the answer's structure, never found in its text, in each
API's own place for it (chat and completions, Anthropic's Messages, the Responses
API); an answer too large to parse on the event loop is parsed on the body thread
(``fleet.gateway.validate``). Nothing here changes an answer except the usage-only
event the gateway asked for on the client's behalf, taken out again.
"""

import json

from . import validate

_SSE_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")
_MAX_LINE = 1 << 20
_USAGE = b'"usage"'


def carries_text(event: bytes) -> bool:
    """Whether a streamed event carries generated text: a token, for engines without usage.

    The first event (the role) and the last (the finish reason) carry none. Written
    out rather than as ``any()`` over tuples: it runs for every event of every
    stream, and the generators cost more than the searches (1.5 against 2.4 µs).
    """
    return (b'"content":' in event or b'"text":' in event) and not (
        b'"content":""' in event
        or b'"content": ""' in event
        or b'"text":""' in event
        or b'"text": ""' in event
    )


# Answers are the engine's JSON, which may hold -Infinity (a logprob) and the like:
# no refused constants here, unlike a client's body.
ANSWER_DECODER = json.JSONDecoder()
# The body thread's, calling Python per integer and object (validate.read says why).
YIELDING_ANSWER_DECODER = json.JSONDecoder(
    parse_int=validate.yielding_int, object_pairs_hook=validate.yielding_object
)


def usage_of(body: bytes, decoder: json.JSONDecoder = ANSWER_DECODER) -> dict | None:
    """The ``usage`` object of an OpenAI-style answer (a whole one, or one streamed
    event's JSON): the top-level key of the object the answer is, read from its
    structure. Never found by searching its text: vLLM writes the client's own
    prompt (``prompt_logprobs``) after the real usage. Any thread."""
    if _USAGE not in body:
        return None  # the common case without usage, at the cost of a search
    try:
        answer = decoder.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    usage = answer.get("usage") if answer.__class__ is dict else None
    return usage if usage.__class__ is dict else None


def decode_object(body: bytes, decoder: json.JSONDecoder = ANSWER_DECODER) -> dict | None:
    """A whole answer as the JSON object it should be; None for anything else."""
    try:
        answer = decoder.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return answer if answer.__class__ is dict else None


async def answer_usage(body: bytes) -> dict | None:
    """``usage_of`` a whole answer: on the loop where it is small, else on the body thread."""
    if validate.on_loop(body):
        return usage_of(body)
    return await validate.off_loop(usage_of, body, YIELDING_ANSWER_DECODER)


def event_of(text: bytes, decoder: json.JSONDecoder = ANSWER_DECODER) -> dict | None:
    """A ``data:`` line's event object; None for one that is not a JSON object."""
    try:
        event = decoder.decode(text[5:].decode("utf-8", "surrogatepass"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return event if event.__class__ is dict else None


def usage_in(event: dict | None) -> dict | None:
    """The top-level ``usage`` object of an event or a parsed answer; None without one."""
    usage = event.get("usage") if event is not None else None
    return usage if usage.__class__ is dict else None


def _message_usage(event: dict | None) -> dict | None:
    """Anthropic's stream: ``message_start`` carries it in its message, ``message_delta``
    at the top (cumulative: it overrides what came before)."""
    usage = usage_in(event)
    if usage is None and event is not None:
        message = event.get("message")
        usage = usage_in(message) if message.__class__ is dict else None
    return usage


def _response_usage(event: dict | None) -> dict | None:
    """The Responses API's stream: in the response that ``response.completed`` (or
    ``.incomplete``, ``.failed``) carries."""
    response = event.get("response") if event is not None else None
    return usage_in(response) if response.__class__ is dict else None


# The usage in an engine's own events, by the API it speaks (None: chat and completions).
_USAGE_IN = {None: usage_in, "messages": _message_usage, "responses": _response_usage}
# The events that end an engine's own stream of these APIs (they send no [DONE]).
_ENDS = {
    None: (),
    "messages": (b"message_stop", b"error"),
    "responses": (b"response.completed", b"response.incomplete", b"response.failed", b"error"),
}


class SSECheck:
    """Lets through only whole, well-formed event-stream lines and notices the final [DONE].

    Holding back a partial line means the client never sees half an event,
    so an error event can always follow cleanly.
    """

    __slots__ = (
        "tail",
        "done",
        "events",
        "usage",
        "strip_usage",
        "_dropped",
        "later",
        "usage_in",
        "ends",
        "named",
        "merge",
    )

    def __init__(self, strip_usage: bool = False, api: str | None = None):
        self.tail = b""
        self.done = False
        self.events = 0  # events carrying text: one token each, for engines that send
        self.usage = None  # no usage (the last event's, where they send it)
        # Events that name usage, in order, for ``settle``: a line too large to
        # parse on the loop, or a usage (a dict) read after one.
        self.later: list = []
        # Take out the usage-only event (``"choices": []``) the gateway asked for.
        self.strip_usage = strip_usage
        self._dropped = False
        # An engine's own stream of the Messages or Responses API (``api``): its usage
        # where that API puts it, its end at its last event, its events counted.
        self.usage_in = _USAGE_IN[api]
        self.ends = _ENDS[api]
        self.named = 0
        self.merge = api == "messages"

    def take(self, usage: dict) -> None:
        """A usage read from an event: the latest, or added to (Anthropic's comes in two)."""
        self.usage = {**self.usage, **usage} if self.merge and self.usage else usage

    def feed(self, chunk: bytes) -> tuple[bytes, str | None]:
        data = self.tail + chunk if self.tail else chunk
        cut = data.rfind(b"\n") + 1
        complete, self.tail = data[:cut], data[cut:]
        good = 0
        kept = None  # the lines let through, where an event was taken out
        for line in complete.split(b"\n")[:-1]:
            text = line.rstrip(b"\r")
            if text and not text.startswith(_SSE_FIELDS):
                return (
                    complete[:good] if kept is None else b"".join(kept),
                    f"a line that is not server-sent events: {text[:60]!r}",
                )
            drop = False
            if text in (b"data: [DONE]", b"data:[DONE]"):
                self.done = True
            elif text.startswith(b"data:"):
                if _USAGE in text:
                    # The event's own top-level "usage", from its JSON: text that only
                    # mentions usage (an echoed prompt, a token) is not a report.
                    if len(text) > validate.ON_LOOP_MAX_BYTES:
                        self.later.append(text)
                    else:
                        event = event_of(text)
                        usage = self.usage_in(event)
                        if usage is not None:
                            if self.later:
                                self.later.append(usage)
                            else:
                                self.take(usage)
                            # The usage-only last event (no choices) the gateway asked for.
                            drop = self.strip_usage and event.get("choices") == []
                if carries_text(text):
                    self.events += 1
            elif text.startswith(b"event:"):
                self.named += 1
                if text[6:].strip() in self.ends:
                    self.done = True
            elif not text and self._dropped:
                drop = True  # the blank line that ended the event taken out
            self._dropped = drop and bool(text)
            if drop and kept is None:
                kept = [complete[:good]]
            elif not drop and kept is not None:
                kept.append(line + b"\n")
            good += len(line) + 1
        if kept is not None:
            complete = b"".join(kept)
        if len(self.tail) > _MAX_LINE:
            return complete, f"an event line longer than {_MAX_LINE} bytes"
        return complete, None


async def settle(check: SSECheck) -> None:
    """Read the usage of the events ``feed`` left for later, on the body thread."""
    for item in check.later:
        if item.__class__ is not dict:
            item = check.usage_in(await validate.off_loop(event_of, item, YIELDING_ANSWER_DECODER))
        if item is not None:
            check.take(item)
    check.later.clear()
