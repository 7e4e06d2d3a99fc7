"""The lane (fleet.gateway.lane): whole answers served outside ASGI by ``llmgw_site.serve``.

A client must get from the lane what it gets from the ASGI path. A query string
keeps a request out of the lane, so each test can send the same request both
ways and compare; ``llmgw_gateway_lane_requests_total`` says which way each went.
The lane also keeps the gateway's promises on its own: a silent engine's
deadline, a client that hangs up, a replica that fails before it answers.
"""

import json
import re
import socket
import time
import urllib.error
import urllib.request

import pytest

from tests.factories import inference_key, ready_model
from tests.gateway.live import FAST_REFRESH, post, wait_until

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

CHAT = "/v1/chat/completions"
ASGI = "?via=asgi"  # any query string: the lane takes only the bare paths
HI = [{"role": "user", "content": "hi"}]


def metric(server, name: str, **labels) -> float:
    text = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$" if labels else rf"^{name} (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def lane(server) -> tuple[float, float]:
    """(answered in the lane, handed over to ASGI) so far."""
    name = "llmgw_gateway_lane_requests_total"
    return metric(server, name, way="served"), metric(server, name, way="handed_over")


def shown(headers) -> dict:
    """The headers a client acts on (not the date)."""
    names = ("content-type", "retry-after", "www-authenticate", "x-llmgw-replica")
    return {n: headers.get(n) for n in names}


def without_created(body: bytes):
    answer = json.loads(body)
    answer.pop("created", None)
    return answer


def test_the_lane_answers_as_the_asgi_path_does(gateway_server, upstreams):
    up = upstreams("one")
    ready_model("tiny", [up])
    ready_model("other", [upstreams("two")])
    _, secret = inference_key(allowed_models=["tiny"])
    _, anyone = inference_key(name="anyone")
    _, revoked = inference_key(name="gone")
    request = {"model": "tiny", "messages": HI, "max_tokens": 4}
    # The first request starts the gateway (through ASGI) and leaves a pooled connection.
    assert post(gateway_server, CHAT + ASGI, request, secret)[0] == 200
    from django.utils import timezone

    from fleet.models import ApiKey

    ApiKey.objects.filter(name="gone").update(revoked_at=timezone.now())
    cases = [
        ("an answer", CHAT, request, secret, 200),
        ("embeddings", "/v1/embeddings", {"model": "tiny", "input": ["a", "b"]}, secret, 200),
        ("completions", "/v1/completions", {"model": "tiny", "prompt": "hi"}, secret, 200),
        ("a body that is not JSON", CHAT, b"{not json", secret, 400),
        ("a bad field", CHAT, {"model": "tiny", "messages": "hi"}, secret, 400),
        ("a model nobody has", CHAT, {"model": "nope", "messages": HI}, anyone, 404),
        ("a model the key may not use", CHAT, {"model": "other", "messages": HI}, secret, 403),
    ]
    for what, path, body, key, status in cases:
        served, _ = lane(gateway_server)
        got = post(gateway_server, path, body, key)
        assert lane(gateway_server)[0] == served + 1, f"{what}: not answered in the lane"
        expected = post(gateway_server, path + ASGI, body, key)
        assert lane(gateway_server)[0] == served + 1, f"{what}: a query string took the lane"
        assert got[0] == expected[0] == status, what
        assert shown(got[1]) == shown(expected[1]), what
        assert without_created(got[2]) == without_created(expected[2]), what
    # A request without a key, or with one refused, is refused before its body is
    # read: by the ASGI path, which the lane leaves it to.
    wait_until(lambda: post(gateway_server, CHAT, request, revoked)[0] == 401, what="revoked")
    for key, code in ((None, "missing_api_key"), (revoked, "revoked_api_key")):
        served, handed = lane(gateway_server)
        status, _, body = post(gateway_server, CHAT, request, key)
        assert (status, json.loads(body)["error"]["code"]) == (401, code)
        assert lane(gateway_server) == (served, handed)
    # What the engine was sent is the same both ways.
    assert up.requests[1] == up.requests[2] == request


def test_an_engines_errors_and_large_answers_come_back_the_same_both_ways(
    gateway_server, upstreams
):
    up = upstreams()
    ready_model("tiny", [up])
    _, secret = inference_key()
    request = {"model": "tiny", "messages": HI}
    assert post(gateway_server, CHAT + ASGI, request, secret)[0] == 200
    for mode, status in (("status503", 503), ("not_json", 502), ("deep_error", 500)):
        up.mode = mode
        served, _ = lane(gateway_server)
        got = post(gateway_server, CHAT, request, secret)
        assert lane(gateway_server)[0] == served + 1, mode
        expected = post(gateway_server, CHAT + ASGI, request, secret)
        assert got[0] == expected[0] == status, (mode, got[2][:300])
        assert json.loads(got[2]) == json.loads(expected[2]), mode
    # An answer larger than what the connection buffers before it pauses (256 KiB),
    # to a body small enough for the lane (validate.on_loop: 64 KiB).
    up.mode = "ok"
    many = {"model": "tiny", "input": [1] * 20_000}
    served, _ = lane(gateway_server)
    got = post(gateway_server, "/v1/embeddings", many, secret)
    assert lane(gateway_server)[0] == served + 1
    expected = post(gateway_server, "/v1/embeddings" + ASGI, many, secret)
    assert got[0] == expected[0] == 200
    assert len(got[2]) > 1 << 20 and got[2] == expected[2]


def test_a_client_gone_before_its_body_is_counted_499(gateway_server, upstreams):
    ready_model("tiny", [upstreams()])
    _, secret = inference_key()
    assert post(gateway_server, CHAT, {"model": "tiny", "messages": HI}, secret)[0] == 200
    gone = {"model": "-", "status": "499"}
    before = metric(gateway_server, "llmgw_gateway_requests_total", **gone)
    with socket.create_connection(("127.0.0.1", gateway_server.port)) as sock:
        sock.sendall(
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
            'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model"'.encode()
        )  # the head, and a body that never finishes
    wait_until(
        lambda: metric(gateway_server, "llmgw_gateway_requests_total", **gone) == before + 1,
        what="the hang-up counted",
    )


def test_streams_and_keys_with_limits_go_the_asgi_way(gateway_server, upstreams):
    ready_model("tiny", [upstreams()])
    _, secret = inference_key()
    _, limited = inference_key(name="limited", requests_per_minute=1000)
    assert post(gateway_server, CHAT, {"model": "tiny", "messages": HI}, secret)[0] == 200
    served, handed = lane(gateway_server)
    status, headers, body = post(
        gateway_server, CHAT, {"model": "tiny", "messages": HI, "stream": True}, secret
    )
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert body.rstrip().endswith(b"data: [DONE]")
    assert lane(gateway_server) == (served, handed + 1)  # read, then handed over
    # A key with limits is counted in Redis: such a request never enters the lane.
    status, headers, _ = post(gateway_server, CHAT, {"model": "tiny", "messages": HI}, limited)
    assert status == 200 and headers["x-ratelimit-limit-requests"] == "1000"
    assert lane(gateway_server) == (served, handed + 1)


def test_a_silent_engine_is_504_from_the_lane_and_set_aside(start_gateway, upstreams):
    server = start_gateway(**FAST_REFRESH, LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT_S="1")
    up = upstreams()
    ready_model("tiny", [up])
    _, secret = inference_key()
    replica = post(server, CHAT, {"model": "tiny", "messages": HI}, secret)[1]["x-llmgw-replica"]
    up.mode = "hang"
    served, _ = lane(server)
    began = time.monotonic()
    status, headers, body = post(server, CHAT, {"model": "tiny", "messages": HI}, secret)
    waited = time.monotonic() - began
    assert status == 504, body
    error = json.loads(body)["error"]
    assert error["code"] == "upstream_timeout" and "sent no answer within 1 s" in error["message"]
    assert waited >= 1.0, waited  # not before its time
    assert lane(server)[0] == served + 1
    assert metric(server, "llmgw_gateway_cooldowns_total", model="tiny", replica=replica) == 1
    # Set aside: the next request is told so at once, not sent to the silent engine.
    status, _, body = post(server, CHAT, {"model": "tiny", "messages": HI}, secret)
    assert status == 503 and json.loads(body)["error"]["code"] == "no_ready_replica"
    up.release.set()


def test_a_client_that_hangs_up_in_the_lane_ends_the_engines_request(gateway_server, upstreams):
    up = upstreams()
    ready_model("tiny", [up])
    _, secret = inference_key()
    assert post(gateway_server, CHAT, {"model": "tiny", "messages": HI}, secret)[0] == 200
    up.mode = "hang"
    served, handed = lane(gateway_server)
    body = json.dumps({"model": "tiny", "messages": HI}).encode()
    with socket.create_connection(("127.0.0.1", gateway_server.port)) as sock:
        sock.sendall(
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: up.in_flight == 1, what="the engine has the request")
    wait_until(lambda: up.cancelled == 1, what="the engine's request ended")
    assert metric(gateway_server, "llmgw_gateway_requests_total", model="tiny", status="499") == 1
    assert lane(gateway_server) == (served, handed)  # nothing answered, nothing handed over
    up.release.set()


def test_a_replica_answering_503_in_the_lane_is_retried_on_another(gateway_server, upstreams):
    a, b = upstreams("a"), upstreams("b")
    ready_model("tiny", [a, b])
    _, secret = inference_key()
    # Both replicas get a pooled connection first.
    wait_until(
        lambda: (
            post(gateway_server, CHAT, {"model": "tiny", "messages": HI}, secret)[0] == 200
            and a.served > 0
            and b.served > 0
        ),
        what="both replicas used",
    )
    a.mode = "status503"
    asked = len(a.requests)
    _, handed = lane(gateway_server)
    for _ in range(50):  # the pick between two idle replicas is random
        status, headers, body = post(
            gateway_server, CHAT, {"model": "tiny", "messages": HI}, secret
        )
        assert status == 200, body
        assert json.loads(body)["id"] == "chatcmpl-b"
        if len(a.requests) > asked:
            break
    assert len(a.requests) > asked, "the failing replica was never tried"
    assert metric(gateway_server, "llmgw_gateway_retries_total", model="tiny") == 1
    assert lane(gateway_server)[1] == handed + 1  # its retry went the ASGI way


def test_pipelined_requests_are_answered_in_order(gateway_server, upstreams):
    ready_model("tiny", [upstreams()])
    _, secret = inference_key()
    assert post(gateway_server, CHAT, {"model": "tiny", "messages": HI}, secret)[0] == 200

    def request(body: dict, close: bool = False) -> bytes:
        raw = json.dumps(body).encode()
        return (
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            + ("Connection: close\r\n" if close else "")
            + "\r\n"
        ).encode() + raw

    with socket.create_connection(("127.0.0.1", gateway_server.port), timeout=30) as sock:
        sock.sendall(
            request({"model": "tiny", "messages": HI})
            + request({"model": "nope", "messages": HI})
            + request({"model": "tiny", "messages": HI, "stream": True})
            + request({"model": "tiny", "messages": HI}, close=True)
        )
        got = b""
        while chunk := sock.recv(65536):
            got += chunk  # read to the close the last request asked for
    # Each answer's status line follows the last byte of the one before.
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) [A-Z]", got)
    assert statuses == [b"200", b"404", b"200", b"200"], got[:2000]
    assert got.count(b"data: [DONE]") == 1
    assert got.rstrip().endswith(b"}")  # the last answer is whole


def test_a_body_too_large_for_the_event_loop_is_handed_to_the_asgi_path(gateway_server, upstreams):
    up = upstreams()
    ready_model("tiny", [up])
    _, secret = inference_key()
    request = {"model": "tiny", "input": ["x"] * 20_000}  # about 100 KiB
    assert post(gateway_server, CHAT + ASGI, {"model": "tiny", "messages": HI}, secret)[0] == 200
    served, handed = lane(gateway_server)
    got = post(gateway_server, "/v1/embeddings", request, secret)
    assert got[0] == 200 and len(json.loads(got[2])["data"]) == 20_000
    # parsed on the body thread by the ASGI path, not on the loop by the lane
    assert lane(gateway_server) == (served, handed + 1)
