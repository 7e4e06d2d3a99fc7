"""Tokens are counted from what was served (issue 29): usage read from the answer's JSON
structure, a stream charged for what it delivered when its client leaves, absurd counts
refused, and a usage flush that writes each row once. Through real gateway processes
(``llmgw_site.serve``, as ``make run`` serves) on the real Redis and database."""

import json
import logging
import socket
import time

import pytest

from fleet.gateway.usage import Usage, write
from tests.factories import inference_key, ready_model
from tests.gateway.helpers import Upstream
from tests.gateway.live import client, wait_until
from tests.gateway.test_limits_live import FAST, post
from tests.processes import start_web

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

MSGS = [{"role": "user", "content": "hi"}]


def remaining_tokens(server, secret) -> int:
    """What the key has left of its token limit, as the next answer's headers say."""
    status, headers, _ = post(server.url, secret, {"model": "tiny", "messages": MSGS})
    assert status == 200
    return int(headers["x-ratelimit-remaining-tokens"])


def metric(server, name: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_a_prompt_that_says_usage_does_not_change_what_a_vllm_answer_is_charged(tmp_path):
    # given an engine that writes the prompt's tokens after the usage, as vLLM's
    # prompt_logprobs are, and a key with a token budget
    up = Upstream("a", mode="prompt_logprobs")
    server = start_web(tmp_path, **FAST)
    try:
        ready_model("tiny", [up])
        _, secret = inference_key("team-a", tokens_per_day=1000)
        # when the prompt holds the word "usage" (and what would follow it)
        prompt = 'please mind your "usage": {"prompt_tokens": 0} usage'
        status, _, answer = post(
            server.url,
            secret,
            {"model": "tiny", "messages": [{"role": "user", "content": prompt}]},
        )
        left = remaining_tokens(server, secret)
    finally:
        server.stop()
        up.stop()
    # then the answer reached the client whole, and was charged its real 7 tokens
    assert status == 200 and answer["usage"]["total_tokens"] == 7
    assert any("usage" in str(t) for t in answer["prompt_logprobs"])
    assert left == 1000 - 7


def test_a_stream_its_client_leaves_before_the_end_is_charged_what_was_delivered(tmp_path):
    from fleet.models import KeyUsage

    # given an engine streaming 40 tokens, its usage only at the end, and a key with
    # a daily budget of 100 tokens
    up = Upstream("a", token_delay=0.05)
    up.tokens = [f" t{i}" for i in range(40)]
    server = start_web(tmp_path, **FAST)
    try:
        ready_model("tiny", [up])
        key, secret = inference_key("team-a", tokens_per_day=100)
        body = json.dumps({"model": "tiny", "messages": MSGS, "stream": True}).encode()

        # when a client reads 30 of its events and goes away
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + secret.encode() + b"\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
            )
            seen = b""
            while seen.count(b'"content"') < 30:
                chunk = s.recv(65536)
                assert chunk, "the stream ended early"
                seen += chunk
        wait_until(lambda: up.cancelled == 1, what="the engine told to stop")

        # then the tokens it was sent are charged against the budget
        left = remaining_tokens(server, secret)  # itself 7 more, after its headers
        rows = wait_until(
            lambda: (r := list(KeyUsage.objects.filter(key=key))) and r[0].requests == 2 and r,
            what="the usage flush",
        )
    finally:
        server.stop()
        up.stop()
    assert 30 <= 100 - left < 40
    assert 30 + 4 <= rows[0].completion_tokens < 40 + 4


def test_an_absurd_token_count_is_refused_and_hurts_no_other_key(tmp_path, caplog):
    from fleet.models import KeyUsage

    # given an engine that reports 2^63 prompt tokens, and a bystander whose engine does not
    bad, good = Upstream("a"), Upstream("b")
    bad.usage = {"prompt_tokens": 2**63, "completion_tokens": 4, "total_tokens": 2**63 + 4}
    server = start_web(tmp_path, **FAST)
    try:
        ready_model("broken", [bad], node_prefix="gw-a")
        ready_model("tiny", [good], node_prefix="gw-b")
        abuser, abuser_secret = inference_key("abuser", tokens_per_day=1000)
        bystander, bystander_secret = inference_key("bystander", tokens_per_day=1000)
        # when the abuser's answer reports it
        answer = client(server, abuser_secret).chat.completions.create(
            model="broken", messages=MSGS
        )
        # then the answer is served, the count refused, logged and counted
        assert answer.choices[0].message.content == "Hello, fleet!"
        wait_until(lambda: metric(server, "llmgw_gateway_usage_refused_total") >= 1)
        assert "engine usage refused model=broken prompt_tokens=" in server.output()
        # and limits still hold for every key: nothing past the maximum was charged
        status, headers, _ = post(server.url, abuser_secret, {"model": "tiny", "messages": MSGS})
        assert status == 200 and headers["x-ratelimit-remaining-tokens"] == "1000"
        # the bystander's one request is counted once, flush after flush
        post(server.url, bystander_secret, {"model": "tiny", "messages": MSGS})
        wait_until(lambda: KeyUsage.objects.filter(key=bystander).exists(), what="a flush")
        time.sleep(1.0)  # three more flushes: a flush that repeats rows would show here
        row = KeyUsage.objects.get(key=bystander)
        abuser_rows = {r.model: r.prompt_tokens for r in KeyUsage.objects.filter(key=abuser)}
    finally:
        server.stop()
        bad.stop()
        good.stop()
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 3, 4)
    assert abuser_rows == {"broken": 0, "tiny": 3}


def test_a_usage_row_the_database_refuses_is_dropped_and_the_others_written_once(
    transactional_db, caplog
):
    from fleet.models import KeyUsage

    # given counts of two keys, one with a count no database column holds
    good, _ = inference_key("good")
    bad, _ = inference_key("bad")
    usage = Usage()
    now = time.time()
    usage.add(good.pk, "tiny", 3, 4, now)
    usage.add(bad.pk, "tiny", 2**64, 4, now)

    # when it is written, and written again with what it kept
    with caplog.at_level(logging.ERROR, logger="fleet.gateway.usage"):
        kept = write(usage.take())
        again = write(kept)

    # then the good row is written once, the bad one dropped and logged, nothing kept
    assert kept == {} and again == {}
    row = KeyUsage.objects.get(key=good)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 3, 4)
    assert not KeyUsage.objects.filter(key=bad).exists()
    assert f"key usage row dropped: the database refused it key_id={bad.pk}" in caplog.text
