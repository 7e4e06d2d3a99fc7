"""The least an ASGI app on uvicorn can do per request, for bench/gateway.py's ``--asgi-floor``.

Reads the request and answers every path with the same small chat completion,
on the same uvicorn, uvloop and httptools as ``llmgw_site.serve``: what is left
of a request's CPU once every line of llmgw is taken away. The gateway's CPU
above this is its own work and its second socket (to the engine).
"""

BODY = (
    b'{"id":"chatcmpl-floor","object":"chat.completion","created":0,"model":"tiny",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"a"},'
    b'"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,'
    b'"total_tokens":2}}'
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
