"""The least an ASGI app on uvicorn can do per request, for bench/gateway.py's ``--asgi-floor``.

Reads the request and answers every path with the same small chat completion (or,
asked to stream, a chunk a token and ``[DONE]``),
on the same uvicorn, uvloop and httptools as ``llmgw_site.serve``: what is left
of a request's CPU once every line of llmgw is taken away. The gateway's CPU
above this is its own work and its second socket (to the engine).
"""

import json

BODY = (
    b'{"id":"chatcmpl-floor","object":"chat.completion","created":0,"model":"tiny",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"a"},'
    b'"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,'
    b'"total_tokens":2}}'
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]


CHUNK = (
    b'data: {"id":"chatcmpl-floor","object":"chat.completion.chunk","created":0,'
    b'"model":"tiny","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
)
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body) if body else {}
    if not request.get("stream"):
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": BODY})
        return
    # As the fake engine streams: a chunk a token, then [DONE].
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    for _ in range(int(request.get("max_tokens") or 1)):
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
