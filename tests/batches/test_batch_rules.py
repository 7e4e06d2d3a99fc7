"""The Batch API's rules without a database: input lines, the state machine, when a
line waits, what an answer means, the lines' credential, and which paths are whose."""

import json

import pytest

from fleet.batch_api import edge
from fleet.models import BatchStatus as S
from fleet.services.batches import jsonl, lifecycle, pause, sending
from fleet.services.batches.sending import Answer

LIMITS = {"chat/completions": 16 << 20, "completions": 4 << 20, "embeddings": 8 << 20}


def chat_line(custom_id="q-1", model="tiny", **over) -> dict:
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
    }
    line.update(over)
    return line


def encode(*lines) -> list[bytes]:
    return [(x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines]


def gateway_rule(endpoint, raw):
    """The gateway's own rule, as the upload view gives it."""
    from fleet.gateway import validate
    from fleet.gateway.errors import GatewayError

    try:
        validate.parse(endpoint, raw)
    except GatewayError as exc:
        raise jsonl.BodyError(exc.message, exc.param) from None


def check(lines, max_lines=100):
    return jsonl.check(lines, max_lines=max_lines, max_body_bytes=LIMITS, check_body=gateway_rule)


# ---- input files ----------------------------------------------------------------------


def test_a_good_file_is_counted_with_the_first_line_of_each_url_and_model():
    checked = check(
        encode(
            chat_line("a"),
            chat_line("b", model="other"),
            chat_line("c"),
        )
    )
    assert checked.lines == 3
    assert checked.summary() == {
        "urls": {"/v1/chat/completions": 1},
        "models": {"tiny": 1, "other": 2},
    }


@pytest.mark.parametrize(
    "bad, line, says, param",
    [
        (b"{not json", 2, "line 2: the line is not valid JSON", None),
        (b"", 2, "line 2: the line is empty", None),
        (b"[1, 2]", 2, "line 2: the line must be a JSON object", None),
        (
            b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"model": "m", "messages": [], "temperature": NaN}}',
            2,
            "not valid JSON",
            None,
        ),
        (b"\xff\xfe{}", 2, "line 2: the line is not UTF-8", None),
        (chat_line(custom_id=""), 2, "'custom_id' must be a non-empty string", "custom_id"),
        (chat_line(custom_id=7), 2, "'custom_id' must be a non-empty string", "custom_id"),
        (chat_line(custom_id="a"), 2, "custom_id 'a' is used by line 1 already", "custom_id"),
        (chat_line(method="GET"), 2, "'method' must be \"POST\"", "method"),
        (chat_line(url="/v1/models"), 2, "'url' '/v1/models' is not one a batch runs", "url"),
        (chat_line(body="hello"), 2, "'body' must be a JSON object", "body"),
        (
            chat_line(body={"model": "m", "messages": [{"role": "user"}], "stream": True}),
            2,
            "'body.stream' must be false or absent",
            "body.stream",
        ),
        (
            chat_line(body={"messages": [{"role": "user", "content": "x"}]}),
            2,
            "line 2: body: 'model' is required",
            "body.model",
        ),
        (
            chat_line(body={"model": "m"}),
            2,
            "body: 'messages' is required for /v1/chat/completions",
            "body.messages",
        ),
        (
            chat_line(body={"model": "m", "messages": [{"role": "user"}], "max_tokens": "9"}),
            2,
            "body: 'max_tokens' must be an integer",
            "body.max_tokens",
        ),
    ],
)
def test_the_first_bad_line_is_named_with_what_is_wrong(bad, line, says, param):
    with pytest.raises(jsonl.LineError) as err:
        check(encode(chat_line("a"), bad, chat_line("z")))
    assert says in str(err.value)
    assert str(err.value).startswith(f"line {line}: ")
    assert err.value.line == line
    assert err.value.param == param


def test_each_endpoint_is_checked_by_its_own_rule():
    embeddings = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings"}
    assert check(encode({**embeddings, "body": {"model": "m", "input": "x"}})).lines == 1
    with pytest.raises(jsonl.LineError, match="'input' is required for /v1/embeddings"):
        check(encode({**embeddings, "body": {"model": "m", "prompt": "x"}}))
    completion = {"custom_id": "c", "method": "POST", "url": "/v1/completions"}
    assert check(encode({**completion, "body": {"model": "m", "prompt": "x"}})).lines == 1


def test_an_empty_file_and_one_too_long_are_refused_as_a_whole():
    with pytest.raises(jsonl.LineError, match="the file is empty") as err:
        check([])
    assert err.value.line == 0
    with pytest.raises(jsonl.LineError, match="more than 2 lines"):
        check(encode(chat_line("a"), chat_line("b"), chat_line("c")), max_lines=2)


def test_a_body_over_its_endpoints_limit_is_refused_before_it_is_checked():
    big = chat_line(body={"model": "m", "messages": [{"role": "user", "content": "x" * 3000}]})
    small = {"chat/completions": 1000, "completions": 1000, "embeddings": 1000}
    with pytest.raises(jsonl.LineError, match="/v1/chat/completions takes 1000 at most"):
        jsonl.check(encode(big), max_lines=9, max_body_bytes=small, check_body=gateway_rule)
    # and a line far past any endpoint's limit is refused before it is parsed
    huge = chat_line(body={"model": "m", "messages": [{"role": "user", "content": "x" * 9000}]})
    with pytest.raises(jsonl.LineError, match="a request may be 5096 at most"):
        jsonl.check(encode(huge), max_lines=9, max_body_bytes=small, check_body=gateway_rule)


def test_windows_line_ends_are_lines_too():
    checked = check(
        [json.dumps(chat_line("a")).encode() + b"\r\n", json.dumps(chat_line("b")).encode()]
    )
    assert checked.lines == 2


# ---- the state machine -----------------------------------------------------------------

ALL = list(S)
MOVES = {
    (S.VALIDATING, S.IN_PROGRESS),
    (S.VALIDATING, S.FAILED),
    (S.VALIDATING, S.CANCELLING),
    (S.IN_PROGRESS, S.CANCELLING),
    (S.IN_PROGRESS, S.FINALIZING),
    (S.FINALIZING, S.COMPLETED),
    (S.FINALIZING, S.EXPIRED),
    (S.CANCELLING, S.CANCELLED),
}


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("dst", ALL)
def test_a_batch_moves_only_along_openais_arrows(src, dst):
    assert lifecycle.may_move(src, dst) == ((src, dst) in MOVES)


def test_a_finished_batch_never_moves_again():
    from fleet.models import BATCH_FINISHED

    for src in BATCH_FINISHED:
        assert not any(lifecycle.may_move(src, dst) for dst in ALL)


@pytest.mark.parametrize(
    "status, total, answered, in_flight, ended, step",
    [
        (S.IN_PROGRESS, 20, 5, 2, False, None),  # keep sending
        (S.IN_PROGRESS, 20, 20, 0, False, S.COMPLETED),  # every line answered
        (S.IN_PROGRESS, 20, 20, 0, True, S.COMPLETED),  # just in time
        (S.IN_PROGRESS, 20, 5, 2, True, None),  # window over: wait for those in flight
        (S.IN_PROGRESS, 20, 5, 0, True, S.EXPIRED),  # then expire with what was answered
        (S.CANCELLING, 20, 5, 1, False, None),  # cancelled: wait for those in flight
        (S.CANCELLING, 20, 5, 0, False, S.CANCELLED),
        (S.FINALIZING, 20, 20, 0, False, S.COMPLETED),  # a finish that died: again
        (S.FINALIZING, 20, 7, 0, True, S.EXPIRED),
        (S.VALIDATING, 20, 0, 0, False, None),  # beat's to check, not the runner's
        (S.COMPLETED, 20, 20, 0, False, None),
    ],
)
def test_what_a_runner_does_with_a_batch(status, total, answered, in_flight, ended, step):
    got = lifecycle.next_step(
        status, total=total, answered=answered, in_flight=in_flight, ended=ended
    )
    assert got == step


# ---- when a line waits -----------------------------------------------------------------


@pytest.mark.parametrize(
    "model, facts, why",
    [
        ("m", pause.Facts(ready=frozenset({"m"})), ""),
        ("m", pause.Facts(ready=frozenset()), "model 'm' has no ready replica"),
        (
            "m",
            pause.Facts(ready=frozenset({"m"}), waiting={"m": 3}),
            "3 interactive request(s) wait for model 'm'",
        ),
        ("m", pause.Facts(ready=frozenset({"m"}), waiting={"other": 3}), ""),
        # An adapter's lines follow its base model.
        ("sql", pause.Facts(ready=frozenset({"m"}), base_of={"sql": "m"}), ""),
        (
            "sql",
            pause.Facts(ready=frozenset({"m"}), waiting={"m": 1}, base_of={"sql": "m"}),
            "1 interactive request(s) wait for model 'm'",
        ),
    ],
)
def test_a_line_waits_while_interactive_requests_wait_or_no_replica_is_ready(model, facts, why):
    assert pause.why_paused(model, facts) == why


@pytest.mark.django_db
def test_interactive_requests_waiting_or_queued_at_any_gateway_pause_the_lines():
    from fleet.services.autoscaler import load

    load.forget()
    try:
        # two gateway processes: one has a request waiting for a replica of qwen, the
        # other two queued for room on llama's busy replicas; mistral is answering only
        load.write("gw-1", {"qwen": [0, 1, None, 0], "llama": [2, 0, None, 0]})
        load.write("gw-2", {"llama": [0, 0, None, 2], "mistral": [3, 0, None, 0]})
        facts = pause.gather()
    finally:
        load.forget()
    assert facts.waiting == {"qwen": 1, "llama": 2}
    assert pause.why_paused("llama", facts) == "2 interactive request(s) wait for model 'llama'"


# ---- what an answer means --------------------------------------------------------------


def error(code):
    return json.dumps({"error": {"message": "x", "code": code}}).encode()


@pytest.mark.parametrize(
    "answer, attempts, wait_s",
    [
        (Answer(200, b"{}"), 1, None),
        (Answer(400, error(None)), 1, None),  # the client's mistake is the line's answer
        (Answer(403, error("model_not_allowed")), 1, None),
        (Answer(None), 1, 5.0),  # the gateway away: again
        (Answer(429, error("rate_limit_exceeded"), retry_after=12), 1, 12),
        (Answer(429, error("model_at_capacity")), 1, 5.0),
        (Answer(429, error("insufficient_quota"), retry_after=3600), 1, None),  # budget spent
        (Answer(503, error("no_ready_replica"), retry_after=2), 1, 2),
        (Answer(503, error("limits_unavailable")), 9, 5.0),  # not now, however often
        (Answer(502, error("upstream_unavailable")), 1, 5.0),
        (Answer(502, error("upstream_unavailable")), sending.ATTEMPTS, None),
        (Answer(500, error("internal")), sending.ATTEMPTS - 1, 5.0),
    ],
)
def test_whether_an_answer_is_the_lines_or_it_goes_again(answer, attempts, wait_s):
    assert sending.verdict(answer, attempts, 5.0) == wait_s


# ---- the lines' credential -------------------------------------------------------------


def test_a_batch_credential_names_its_keys_digest_until_it_expires(settings):
    from fleet.services.batches import credentials

    token = credentials.mint("ab" * 32, "batch_1", now=1000)
    assert token.startswith("lgb_")
    assert credentials.key_digest(token, now=1000 + 10) == "ab" * 32
    assert credentials.key_digest(token, now=1000 + credentials.LIFETIME_S + 1) is None
    forged = token.replace("ab" * 32, "cd" * 32)
    assert credentials.key_digest(forged, now=1000) is None
    assert credentials.key_digest("lgk_12345678_whatever", now=1000) is None
    settings.SECRET_KEY = "another installation"
    assert credentials.key_digest(token, now=1000) is None


def test_the_gateway_looks_a_batch_credential_up_by_its_keys_digest():
    from fleet.gateway import keys
    from fleet.services.batches import credentials

    assert keys.digest_of(credentials.mint("ef" * 32, "batch_2")) == "ef" * 32
    assert keys.digest_of("lgb_made.up.123:sig") is None


def test_a_batch_credential_past_its_end_is_refused_though_its_digest_is_known():
    # a gateway process keeps the digest of every header it has read: the end of a
    # batch's credential is checked on each request, not only on the first
    from fleet.gateway import keys
    from fleet.gateway.errors import GatewayError
    from fleet.services.batches import credentials

    entry = keys.KeyEntry(1, "ci", "lgk_ab12cd34", "inference", frozenset(), None, False)
    token = credentials.mint("ab" * 32, "batch_1", now=1000)
    assert keys.check(entry, token, 1000 + 10) is entry
    with pytest.raises(GatewayError) as refused:
        keys.check(entry, token, 1000 + credentials.LIFETIME_S + 1)
    assert (refused.value.status, refused.value.code) == (401, "expired_api_key")


# ---- which paths are the Batch API's --------------------------------------------------


@pytest.mark.parametrize(
    "path, ours",
    [
        ("/v1/files", True),
        ("/v1/files/file-abc", True),
        ("/v1/files/file-abc/content", True),
        ("/v1/batches", True),
        ("/v1/batches/batch_1/cancel", True),
        ("/v1/filesystem", False),
        ("/v1/chat/completions", False),
        ("/v1/models", False),
    ],
)
def test_the_batch_api_paths_go_to_django(path, ours):
    assert edge.handles(path) == ours
