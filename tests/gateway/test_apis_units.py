"""/v1/messages and /v1/responses without processes: the requests translated to chat
completions, the answers and streams translated back and read by the official SDKs
(over an in-memory transport), the refusals, the usage and the error shapes."""

import asyncio
import json

import anthropic
import httpx2
import openai
import pydantic
import pytest

from fleet.gateway import apis, validate
from fleet.gateway.answers import SSECheck
from fleet.gateway.errors import GatewayError
from fleet.gateway.metrics import counts
from fleet.gateway.proxy import translated


def parse(endpoint: str, body: dict) -> validate.ParsedRequest:
    return validate.parse(endpoint, json.dumps(body).encode())


def refusal(endpoint: str, body: dict) -> GatewayError:
    """The 400 a request gets: at once (``check``), or where it is translated."""
    try:
        req = parse(endpoint, body)
    except GatewayError as exc:
        return exc
    assert req.chat_error is not None, f"not refused: {req.chat}"
    return req.chat_error


MSG = {"model": "m", "max_tokens": 8}


# ---- the requests -------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            {**MSG, "messages": [{"role": "user", "content": "hi"}]},
            {"messages": [{"role": "user", "content": "hi"}]},
        ),
        (
            {
                **MSG,
                "system": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "ok"}],
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    }
                ],
            },
            {
                "messages": [
                    {"role": "system", "content": "be brief\nok"},
                    {"role": "user", "content": "ab"},
                ]
            },
        ),
        (
            {
                **MSG,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "AAA",
                                },
                            },
                            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                        ],
                    }
                ],
            },
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AAA"},
                            },
                            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                        ],
                    }
                ]
            },
        ),
        (
            # a tool call and its result; earlier reasoning is dropped
            {
                **MSG,
                "messages": [
                    {"role": "user", "content": "weather?"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "hmm", "signature": "s"},
                            {"type": "text", "text": "Looking."},
                            {
                                "type": "tool_use",
                                "id": "t1",
                                "name": "get",
                                "input": {"city": "Oslo"},
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": "rain"},
                            {"type": "text", "text": "and tomorrow?"},
                        ],
                    },
                ],
            },
            {
                "messages": [
                    {"role": "user", "content": "weather?"},
                    {
                        "role": "assistant",
                        "content": "Looking.",
                        "tool_calls": [
                            {
                                "id": "t1",
                                "type": "function",
                                "function": {"name": "get", "arguments": '{"city": "Oslo"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "t1", "content": "rain"},
                    {"role": "user", "content": "and tomorrow?"},
                ]
            },
        ),
        (
            {
                **MSG,
                "messages": [{"role": "user", "content": "hi"}],
                "stop_sequences": ["END"],
                "temperature": 0.5,
                "top_k": 4,
                "metadata": {"user_id": "u-1"},
                "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                "output_config": {
                    "effort": "low",
                    "format": {"type": "json_schema", "schema": {"type": "object"}},
                },
                "stream": True,
            },
            {
                "messages": [{"role": "user", "content": "hi"}],
                "stop": ["END"],
                "temperature": 0.5,
                "top_k": 4,
                "user": "u-1",
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "get",
                            "parameters": {"type": "object"},
                            "description": "d",
                        },
                    }
                ],
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": {"type": "object"}},
                },
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
    ],
)
def test_a_messages_request_becomes_the_chat_completion_that_asks_the_same(body, expected):
    assert parse("messages", body).chat == {"model": "m", "max_tokens": 8, **expected}


@pytest.mark.parametrize(
    "body, param, says",
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", "required"),
        ({**MSG, "messages": []}, "messages", "must not be empty"),
        ({**MSG, "messages": [{"role": "system", "content": "x"}]}, "messages[0]", '"user"'),
        ({**MSG, "messages": [{"role": "user", "content": 3}]}, "messages[0].content", "string"),
        ({**MSG, "messages": [{"role": "user", "content": "x"}], "system": 3}, "system", "string"),
        (
            {
                **MSG,
                "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            },
            "messages[0].content[0]",
            "'document'",
        ),
        (
            {
                **MSG,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools[0]",
            "Anthropic's servers",
        ),
        (
            {**MSG, "messages": [{"role": "user", "content": "x"}], "mcp_servers": [{"url": "u"}]},
            "mcp_servers",
            "Anthropic's servers",
        ),
    ],
)
def test_a_messages_request_without_a_chat_counterpart_is_a_400_naming_the_field(body, param, says):
    exc = refusal("messages", body)
    assert (exc.status, exc.param) == (400, param)
    assert says in exc.message


RESP = {"model": "m"}


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            {**RESP, "input": "hi", "instructions": "be brief", "max_output_tokens": 5},
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"},
                ],
                "max_tokens": 5,
            },
        ),
        (
            # history as items: the developer's message is the system's; a call after
            # the assistant's text joins its turn; its output is a tool message
            {
                **RESP,
                "input": [
                    {"role": "developer", "content": "terse"},
                    {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "Looking."}],
                    },
                    {"type": "reasoning", "id": "rs_1", "summary": []},
                    {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "rain"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "this?"},
                            {
                                "type": "input_image",
                                "image_url": "https://x/y.png",
                                "detail": "low",
                            },
                        ],
                    },
                ],
                "store": False,
            },
            {
                "messages": [
                    {"role": "system", "content": "terse"},
                    {"role": "user", "content": "weather?"},
                    {
                        "role": "assistant",
                        "content": "Looking.",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "get", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "rain"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "this?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "https://x/y.png", "detail": "low"},
                            },
                        ],
                    },
                ]
            },
        ),
        (
            {
                **RESP,
                "input": "hi",
                "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}}],
                "tool_choice": {"type": "function", "name": "get"},
                "text": {
                    "format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}
                },
                "temperature": 0.2,
                "stream": True,
            },
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "get", "parameters": {"type": "object"}},
                    }
                ],
                "tool_choice": {"type": "function", "function": {"name": "get"}},
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": "object"}},
                },
                "temperature": 0.2,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
    ],
)
def test_a_responses_request_becomes_the_chat_completion_that_asks_the_same(body, expected):
    assert parse("responses", body).chat == {"model": "m", **expected}


@pytest.mark.parametrize(
    "body, param, says",
    [
        # state llmgw cannot keep: refused, never ignored, whichever engine serves it
        ({**RESP, "input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "input"),
        ({**RESP, "input": "x", "store": True}, "store", "'store': false"),
        ({**RESP, "input": "x", "background": True}, "background", "stream"),
        ({**RESP, "input": "x", "conversation": "conv_1"}, "conversation", "input"),
        ({**RESP, "input": "x", "prompt": {"id": "pmpt_1"}}, "prompt", "stored prompts"),
        ({**RESP}, "input", "required"),
        ({**RESP, "input": "x", "max_output_tokens": 0}, "max_output_tokens", "at least 1"),
        # no chat counterpart: where the request is translated
        (
            {**RESP, "input": "x", "tools": [{"type": "web_search"}]},
            "tools[0]",
            "OpenAI's servers",
        ),
        (
            {**RESP, "input": [{"type": "item_reference", "id": "msg_1"}]},
            "input[0]",
            "did not keep",
        ),
        (
            {
                **RESP,
                "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
            },
            "input[0].content[0]",
            "'input_file'",
        ),
    ],
)
def test_a_responses_request_llmgw_cannot_honour_is_a_400_naming_the_field(body, param, says):
    exc = refusal("responses", body)
    assert (exc.status, exc.param) == (400, param)
    assert says in exc.message and param.split("[")[0] in exc.message


# ---- the answers, through the official SDKs ---------------------------------------------


def chunk(delta=None, finish=None, usage=None, choices=True) -> dict:
    out = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "model": "tiny"}
    out["choices"] = (
        [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    )
    if usage is not None:
        out["usage"] = usage
    return out


USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
TEXT = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({"content": "!"}, finish="length"),
    chunk(usage=USAGE, choices=False),
]
TOOL = [
    chunk({"role": "assistant", "content": "Let me look."}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    chunk(
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}, finish="tool_calls"
    ),
    chunk(usage=USAGE, choices=False),
]


def stream_bytes(endpoint: str, body: dict, chunks: list[dict], split: int = 7) -> bytes:
    """What the gateway sends for an engine's chat stream of ``chunks`` (fed in pieces of
    ``split`` bytes, as the network cuts them)."""
    req = parse(endpoint, body)
    framing = apis.framing(req)
    framing.translating = True
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    raw += b"data: [DONE]\n\n"
    check, out = SSECheck(), []

    async def run():
        for i in range(0, len(raw), split):
            good, problem = check.feed(raw[i : i + split])
            assert problem is None
            out.append(await translated(framing, good))

    asyncio.run(run())
    assert check.done and framing.ended
    raw = b"".join(out)
    strictly(endpoint, raw)
    return raw


# Each event as the SDK's own types define it, every required field present: the SDKs
# themselves build events without checking, so a missing field would surface only
# where a user's code reads it.
_EVENTS = {
    "messages": pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent),
    "responses": pydantic.TypeAdapter(openai.types.responses.ResponseStreamEvent),
}


def strictly(endpoint: str, raw: bytes) -> list[dict]:
    events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    for event in events:
        _EVENTS[endpoint].validate_python(event)
    return events


def sdk_transport(answer: bytes, content_type: str, status: int = 200):
    def handle(request):
        return httpx2.Response(status, content=answer, headers={"content-type": content_type})

    return httpx2.Client(transport=httpx2.MockTransport(handle))


def claude(answer: bytes, ctype="text/event-stream", status=200) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url="http://llmgw",
        api_key="k",
        max_retries=0,
        http_client=sdk_transport(answer, ctype, status),
    )


def oai(answer: bytes, ctype="text/event-stream", status=200) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://llmgw/v1",
        api_key="k",
        max_retries=0,
        http_client=sdk_transport(answer, ctype, status),
    )


ASK = {
    "model": "m",
    "max_tokens": 3,
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
}


def test_a_translated_messages_stream_is_what_anthropics_sdk_streams():
    raw = stream_bytes("messages", ASK, TEXT)
    with claude(raw).messages.stream(**{k: v for k, v in ASK.items() if k != "stream"}) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert [e for e in events if e not in ("text",)] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert final.content[0].text == "Hello!"
    assert (final.stop_reason, final.stop_sequence) == ("max_tokens", None)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 3)
    assert final.id == "msg_7" and final.model == "tiny"
    # every event names itself, as Anthropic's API frames them
    assert raw.count(b"event: ") == raw.count(b"data: ") == len(events) - events.count("text")


def test_a_translated_tool_call_streams_as_a_tool_use_block():
    raw = stream_bytes("messages", ASK, TOOL, split=3)
    with claude(raw).messages.stream(**{k: v for k, v in ASK.items() if k != "stream"}) as s:
        final = s.get_final_message()
    text, call = final.content
    assert text.text == "Let me look."
    assert (call.type, call.id, call.name, call.input) == (
        "tool_use",
        "call_1",
        "get",
        {"city": "Oslo"},
    )
    assert final.stop_reason == "tool_use"


def test_a_stream_without_the_engines_usage_counts_the_pieces_streamed():
    # llama-cpp-python's server sends no usage in a stream, asked or not
    raw = stream_bytes("messages", ASK, TEXT[:-1])
    with claude(raw).messages.stream(**{k: v for k, v in ASK.items() if k != "stream"}) as s:
        final = s.get_final_message()
    assert (final.usage.input_tokens, final.usage.output_tokens) == (0, 3)


RASK = {"model": "m", "input": "hi", "max_output_tokens": 3, "stream": True}


def test_a_translated_responses_stream_is_what_openais_sdk_streams():
    raw = stream_bytes("responses", {**RASK, "instructions": "be brief"}, TEXT)
    with oai(raw).responses.stream(model="m", input="hi") as s:
        events = [e.type for e in s]
    assert events == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    # the last event carries the whole response: its text, its status, its usage
    last = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")][-1]
    response = openai.types.responses.Response.model_validate(last["response"])
    assert response.output_text == "Hello!"
    assert (response.status, response.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert (
        response.usage.input_tokens,
        response.usage.output_tokens,
        response.usage.total_tokens,
    ) == (9, 3, 12)
    assert response.instructions == "be brief" and response.store is False
    assert [
        json.loads(line[6:])["sequence_number"]
        for line in raw.split(b"\n")
        if line.startswith(b"data: ")
    ] == list(range(11))


def test_a_completed_responses_stream_ends_with_the_final_response():
    chunks = [*TEXT[:3], chunk({"content": "!"}, finish="stop"), TEXT[-1]]
    raw = stream_bytes("responses", RASK, chunks)
    with oai(raw).responses.stream(model="m", input="hi") as s:
        texts = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(texts) == final.output_text == "Hello!"
    assert final.status == "completed" and final.usage.output_tokens == 3


def test_a_translated_function_call_streams_as_a_function_call_item():
    chunks = [
        *TOOL[:-2],
        chunk(
            {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]},
            finish="tool_calls",
        ),
        TOOL[-1],
    ]
    raw = stream_bytes("responses", RASK, chunks, split=5)
    with oai(raw).responses.stream(model="m", input="hi") as s:
        args = [e.delta for e in s if e.type == "response.function_call_arguments.delta"]
        final = s.get_final_response()
    message, call = final.output
    assert message.content[0].text == "Let me look."
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call",
        "call_1",
        "get",
        '{"city": "Oslo"}',
    )
    assert "".join(args) == call.arguments


WHOLE = {
    "id": "chatcmpl-9",
    "object": "chat.completion",
    "model": "tiny",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Sure.",
                "reasoning_content": "easy",
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get", "arguments": '{"a": 1}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 4}},
}


def test_a_whole_answer_is_an_anthropic_message():
    framing = apis.framing(parse("messages", {**ASK, "stream": False}))
    anthropic.types.Message.model_validate(framing.answer(WHOLE))
    answer = json.dumps(framing.answer(WHOLE)).encode()
    message = claude(answer, "application/json").messages.create(
        **{k: v for k, v in ASK.items() if k != "stream"}
    )
    thinking, text, call = message.content
    assert (thinking.type, thinking.thinking) == ("thinking", "easy")
    assert text.text == "Sure." and (call.name, call.input) == ("get", {"a": 1})
    assert message.stop_reason == "tool_use"
    # Anthropic's input leaves the cached part out; the gateway counts both
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (5, 4)
    assert counts(message.usage.model_dump(exclude_none=True), "m") == (9, 3)


def test_a_whole_answer_is_a_response_object():
    framing = apis.framing(parse("responses", {**RASK, "stream": False}))
    openai.types.responses.Response.model_validate(framing.answer(WHOLE))
    answer = json.dumps(framing.answer(WHOLE)).encode()
    response = oai(answer, "application/json").responses.create(model="m", input="hi")
    reasoning, message, call = response.output
    assert reasoning.content[0].text == "easy"
    assert response.output_text == "Sure." and call.arguments == '{"a": 1}'
    assert response.status == "completed" and response.id == "resp_9"
    assert (response.usage.input_tokens, response.usage.input_tokens_details.cached_tokens) == (
        9,
        4,
    )
    assert counts(response.usage.model_dump(), "m") == (9, 3)


@pytest.mark.parametrize(
    "finish, stop, expected",
    [
        ("stop", None, ("end_turn", None)),
        ("stop", "END", ("stop_sequence", "END")),  # vLLM's stop_reason: the stop string
        ("length", None, ("max_tokens", None)),
        ("tool_calls", None, ("tool_use", None)),
        ("content_filter", None, ("refusal", None)),
        ("abort", None, (None, None)),
    ],
)
def test_the_finish_reason_is_anthropics_stop_reason(finish, stop, expected):
    from fleet.gateway.apis.messages import stop_of

    assert stop_of({"finish_reason": finish, "stop_reason": stop}, False) == expected


# ---- errors in each API's shape ------------------------------------------------------


@pytest.mark.parametrize(
    "status, kind, exc_class",
    [
        (400, "invalid_request_error", anthropic.BadRequestError),
        (401, "authentication_error", anthropic.AuthenticationError),
        (403, "permission_error", anthropic.PermissionDeniedError),
        (404, "not_found_error", anthropic.NotFoundError),
        (413, "request_too_large", anthropic.APIStatusError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (502, "api_error", anthropic.InternalServerError),
        (503, "overloaded_error", anthropic.InternalServerError),
        (504, "timeout_error", anthropic.InternalServerError),
    ],
)
def test_the_gateways_errors_on_messages_are_anthropics(status, kind, exc_class):
    _, body = GatewayError(status, "model 'x' says no", code="c").answer("messages")
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": kind, "message": "model 'x' says no"},
    }
    with pytest.raises(exc_class) as err:
        claude(body, "application/json", status).messages.create(
            **{k: v for k, v in ASK.items() if k != "stream"}
        )
    assert err.value.status_code == status and "model 'x' says no" in str(err.value)


def test_a_failed_messages_stream_ends_with_anthropics_error_event():
    framing = apis.framing(parse("messages", ASK))
    framing.translating = True
    raw = framing.chunk(TEXT[1]) + framing.fail("replica r1 closed the stream", status=502)
    with pytest.raises(anthropic.APIStatusError) as err:
        with claude(raw).messages.stream(**{k: v for k, v in ASK.items() if k != "stream"}) as s:
            list(s)
    assert "replica r1 closed the stream" in str(err.value)
    assert err.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "replica r1 closed the stream"},
    }


@pytest.mark.parametrize("started, passed", [(False, 0), (True, 0), (False, 3)])
def test_a_failed_responses_stream_ends_with_its_error_event(started, passed):
    framing = apis.framing(parse("responses", RASK))
    framing.translating = started
    framing.passed = passed
    raw = framing.chunk(TEXT[1]) if started else b""
    raw += framing.fail("model 'm' has no ready replica", "no_ready_replica", 503)
    events = strictly("responses", raw)
    error = next(e for e in events if e["type"] == "error")
    assert (error["code"], error["message"]) == (
        "no_ready_replica",
        "model 'm' has no ready replica",
    )
    if passed:
        # after an engine's own events: its response is the engine's, so the error alone
        assert [e["type"] for e in events] == ["error"]
        return
    # the gateway's own stream: the SDK's helper follows it to response.failed
    with oai(raw).responses.stream(model="m", input="hi") as s:
        seen = [e.type for e in s]
    assert seen[0] == "response.created" and seen[-2:] == ["error", "response.failed"]
    assert events[-1]["response"]["status"] == "failed"


# ---- an engine's own streams: usage and their end ---------------------------------------


def sse(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def test_an_engines_own_messages_stream_is_counted_from_anthropics_usage():
    raw = (
        sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "m",
                    "usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 0},
                },
            },
        )
        + sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "hi"},
            },
        )
        + sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 6},
            },
        )
        + sse("message_stop", {"type": "message_stop"})
    )
    check = SSECheck(api="messages")
    good, problem = check.feed(raw)
    assert good == raw and problem is None
    assert check.done and check.named == 4
    assert counts(check.usage, "m") == (7, 6)


def test_an_engines_own_responses_stream_is_counted_from_its_final_response():
    usage = {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15}
    raw = sse(
        "response.created", {"type": "response.created", "response": {"id": "r", "usage": None}}
    )
    check = SSECheck(api="responses")
    check.feed(raw)
    assert not check.done and check.usage is None
    check.feed(
        sse(
            "response.completed",
            {"type": "response.completed", "response": {"id": "r", "usage": usage}},
        )
    )
    assert check.done and counts(check.usage, "m") == (11, 4)


@pytest.mark.parametrize(
    "usage, expected",
    [
        ({"prompt_tokens": 3, "completion_tokens": 4}, (3, 4)),
        ({"prompt_tokens": 3}, (3, 0)),
        ({"input_tokens": 3, "output_tokens": 4}, (3, 4)),
        (
            {
                "input_tokens": 3,
                "cache_read_input_tokens": 5,
                "cache_creation_input_tokens": 1,
                "output_tokens": 4,
            },
            (9, 4),
        ),
        ({"input_tokens": 3, "output_tokens": -1}, None),
        ({"input_tokens": "3", "output_tokens": 1}, None),
        ({"input_tokens": 10**12, "cache_read_input_tokens": 10**12, "output_tokens": 1}, None),
    ],
)
def test_usage_is_read_in_each_apis_shape(usage, expected):
    assert counts(usage, "m") == expected


@pytest.mark.parametrize(
    "engine, endpoint, native",
    [
        ("vllm", "messages", True),
        ("vllm", "responses", True),
        ("llamacpp", "messages", False),
        ("llamacpp", "responses", False),
        ("sglang", "responses", False),
        ("fake", "messages", False),
        ("vllm", "chat/completions", False),
    ],
)
def test_only_engines_known_to_serve_an_api_get_it_passed_through(engine, endpoint, native):
    assert apis.native(engine, endpoint) is native


@pytest.mark.parametrize(
    "endpoint, body, param",
    [
        ("rerank", {"model": "m", "documents": ["d"]}, "query"),
        ("rerank", {"model": "m", "query": 3, "documents": ["d"]}, "query"),
        ("rerank", {"model": "m", "query": "q"}, "documents"),
        ("score", {"model": "m"}, "text_1"),
        ("score", {"model": "m", "text_1": "q"}, "text_2"),
        ("score", {"model": "m", "queries": "q"}, "documents"),
        ("score", {"model": "m", "data_1": 4, "data_2": "d"}, "data_1"),
    ],
)
def test_a_rerank_or_score_request_missing_a_side_is_a_400_naming_it(endpoint, body, param):
    with pytest.raises(GatewayError) as err:
        parse(endpoint, body)
    assert (err.value.status, err.value.param) == (400, param)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "query": "q", "documents": "d"},
        {"model": "m", "query": "q", "documents": ["d", "e"], "top_n": 1},
    ],
)
def test_a_rerank_request_is_passed_as_it_is(body):
    req = parse("rerank", body)
    assert (req.body, req.chat, apis.framing(req)) == (body, None, None)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "text_1": "q", "text_2": ["d", "e"]},
        {"model": "m", "queries": ["q"], "items": ["d"]},
        {"model": "m", "data_1": "q", "data_2": "d"},
    ],
)
def test_each_of_vllms_spellings_of_a_score_request_is_taken(body):
    assert parse("score", body).body == body


@pytest.mark.parametrize(
    "engine, endpoint, served",
    [
        ("vllm", "rerank", True),
        ("vllm", "score", True),
        ("sglang", "rerank", True),
        ("sglang", "score", False),  # its /v1/score is another API
        ("fake", "rerank", True),
        ("llamacpp", "rerank", False),
        ("llamacpp", "score", False),
    ],
)
def test_rerank_and_score_go_only_to_engines_that_serve_them(engine, endpoint, served):
    assert apis.native(engine, endpoint) is served
    message = apis.unsupported("m", "r1", engine, endpoint).message
    assert "model 'm' cannot be served" in message and "vLLM" in message
