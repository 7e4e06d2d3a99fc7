"""A node's notice of going away: each cloud's answer parsed, the file source, when the
control plane is told, and a notice from a local stand-in reaching the agent's outbox."""

import asyncio
import json
import logging
import os
import time
from datetime import UTC, datetime

import pytest

from agentd import protocol
from agentd.config import ConfigError
from agentd.notice import (
    GCP_MAINTENANCE_S,
    GCP_PREEMPT_S,
    UNKNOWN,
    Answer,
    Notice,
    NoticeError,
    NoticeWatch,
    parse_aws_spot,
    parse_azure,
    parse_file,
    parse_gcp_maintenance,
    parse_gcp_preempted,
)
from tests.agent.cloud_metadata import CloudMetadata
from tests.agent.test_agent_messages import make_agent

NOW = datetime(2026, 12, 6, 9, 58, 0, tzinfo=UTC).timestamp()


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# ---- the clouds' answers --------------------------------------------------------------

# EC2's spot/instance-action as its documentation shows it.
AWS_TERMINATE = '{"action": "terminate", "time": "2026-12-06T10:00:00Z"}'
# Scheduled Events (api-version 2020-07-01) as Azure's documentation shows them.
AZURE_PREEMPT = {
    "DocumentIncarnation": 3,
    "Events": [
        {
            "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
            "EventType": "Preempt",
            "ResourceType": "VirtualMachine",
            "Resources": ["gpu-vm-7"],
            "EventStatus": "Scheduled",
            "NotBefore": "Sun, 06 Dec 2026 09:58:30 GMT",
            "Description": "",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
    ],
}


def azure(*events: dict) -> Answer:
    base = AZURE_PREEMPT["Events"][0]
    return Answer(
        200, json.dumps({"DocumentIncarnation": 1, "Events": [{**base, **e} for e in events]})
    )


@pytest.mark.parametrize(
    "parse, answer, ctx, expected",
    [
        # AWS
        (parse_aws_spot, Answer(404, "Not Found"), {}, None),
        (
            parse_aws_spot,
            Answer(200, AWS_TERMINATE),
            {},
            Notice(at("2026-12-06T10:00:00"), "spot instance-action terminate"),
        ),
        (
            parse_aws_spot,
            Answer(200, '{"action": "stop", "time": "2026-12-06T09:59:00Z"}'),
            {},
            Notice(at("2026-12-06T09:59:00"), "spot instance-action stop"),
        ),
        # GCP
        (parse_gcp_preempted, Answer(200, "FALSE"), {}, None),
        (parse_gcp_preempted, Answer(200, "TRUE"), {}, Notice(NOW + GCP_PREEMPT_S, "preempted")),
        (parse_gcp_maintenance, Answer(200, "NONE"), {}, None),
        (parse_gcp_maintenance, Answer(200, "MIGRATE_ON_HOST_MAINTENANCE"), {}, None),
        (
            parse_gcp_maintenance,
            Answer(200, "TERMINATE_ON_HOST_MAINTENANCE"),
            {},
            Notice(NOW + GCP_MAINTENANCE_S, "host maintenance TERMINATE_ON_HOST_MAINTENANCE"),
        ),
        # Azure
        (parse_azure, Answer(200, '{"DocumentIncarnation": 0, "Events": []}'), {}, None),
        (
            parse_azure,
            Answer(200, json.dumps(AZURE_PREEMPT)),
            {"vm_name": "gpu-vm-7"},
            Notice(at("2026-12-06T09:58:30"), "scheduled event Preempt"),
        ),
        # Another VM of the availability set: not this node's notice.
        (parse_azure, Answer(200, json.dumps(AZURE_PREEMPT)), {"vm_name": "gpu-vm-8"}, None),
        # A pause of seconds is no reason to move replicas.
        (parse_azure, azure({"EventType": "Freeze"}), {"vm_name": "gpu-vm-7"}, None),
        # Started: NotBefore is blank, the event is under way.
        (
            parse_azure,
            azure({"EventType": "Terminate", "EventStatus": "Started", "NotBefore": ""}),
            {"vm_name": "gpu-vm-7"},
            Notice(NOW, "scheduled event Terminate"),
        ),
        # The earliest counted event decides.
        (
            parse_azure,
            azure(
                {"EventType": "Reboot", "NotBefore": "Sun, 06 Dec 2026 10:15:00 GMT"},
                {
                    "EventType": "Redeploy",
                    "NotBefore": "Sun, 06 Dec 2026 10:08:00 GMT",
                    "Description": "Host server is undergoing maintenance.",
                },
            ),
            {"vm_name": "gpu-vm-7"},
            Notice(
                at("2026-12-06T10:08:00"),
                "scheduled event Redeploy: Host server is undergoing maintenance.",
            ),
        ),
    ],
)
def test_each_clouds_answer_parses(parse, answer, ctx, expected):
    assert parse(answer, NOW, ctx) == expected


@pytest.mark.parametrize(
    "parse, answer, words",
    [
        (parse_aws_spot, Answer(200, "<html>captive portal</html>"), "is not JSON"),
        (parse_aws_spot, Answer(200, '{"action": "terminate"}'), "lacks action or time"),
        (parse_aws_spot, Answer(200, '{"action": "stop", "time": "soon"}'), "'soon' is not a time"),
        (parse_aws_spot, Answer(500, "oops"), "answered HTTP 500"),
        (parse_gcp_preempted, Answer(200, "MAYBE"), "neither TRUE nor FALSE"),
        (parse_gcp_preempted, Answer(403, "Missing Metadata-Flavor"), "answered HTTP 403"),
        (parse_azure, Answer(200, '{"Events": {}}'), "has no Events list"),
        (parse_azure, azure({"NotBefore": "next tuesday"}), "is not a time"),
    ],
)
def test_an_unreadable_answer_says_what_is_wrong(parse, answer, words):
    with pytest.raises(NoticeError, match=words):
        parse(answer, NOW, {"vm_name": "gpu-vm-7"})


@pytest.mark.parametrize(
    "text, expected",
    [
        ("120", Notice(NOW + 120, "notice file /run/notice")),
        ("0\n", Notice(NOW, "notice file /run/notice")),
        ('{"in_s": 45.5, "reason": "rack power work"}', Notice(NOW + 45.5, "rack power work")),
        ('{"in_s": 60}', Notice(NOW + 60, "notice file /run/notice")),
    ],
)
def test_the_file_counts_from_its_modification_time(text, expected):
    assert parse_file(text, NOW, "/run/notice") == expected


@pytest.mark.parametrize("text", ["soon", "", "-5", '{"in_s": "2m"}', '{"reason": "x"}', "true"])
def test_a_file_that_is_not_a_notice_is_an_error(text):
    with pytest.raises(NoticeError, match="/run/notice"):
        parse_file(text, NOW, "/run/notice")


# ---- when the control plane is told -----------------------------------------------------


class Clock:
    def __init__(self, now=NOW):
        self.now = now

    def __call__(self):
        return self.now


def test_told_once_again_when_sooner_and_after_a_registration():
    clock = Clock()
    w = NoticeWatch("aws", clock=clock)
    two_minutes = Notice(NOW + 120, "spot instance-action terminate")

    # first seen: told, with the seconds left
    msg = w.update(two_minutes)
    assert (msg.in_s, msg.source, msg.reason) == (120, "aws", "spot instance-action terminate")
    # read again, and again later: nothing new
    clock.now += 5
    assert w.update(two_minutes) is None
    # an unreadable poll changes nothing
    assert w.update(UNKNOWN) is None and w.current == two_minutes
    # a later deadline (GCP's "now + 30 s" read again) does not move it
    assert w.update(Notice(NOW + 200, "x")) is None
    assert w.current == two_minutes
    # sooner: told again
    msg = w.update(Notice(NOW + 60, "spot instance-action terminate"))
    assert msg.in_s == 55
    # after a registration, the seconds left now
    clock.now += 10
    assert w.again().in_s == 45


def test_a_withdrawn_notice_is_forgotten_and_a_new_one_told():
    w = NoticeWatch("aws", clock=Clock())
    assert w.update(Notice(NOW + 120, "r")) is not None
    assert w.update(None) is None
    assert w.again() is None
    assert w.update(Notice(NOW + 120, "r")) is not None


def test_a_passed_deadline_is_told_as_now():
    w = NoticeWatch("aws", clock=Clock())
    assert w.update(Notice(NOW - 30, "late")).in_s == 0


def test_a_notice_more_than_a_week_off_waits_until_it_is_nearer():
    clock = Clock()
    w = NoticeWatch("azure", clock=clock)
    far = Notice(NOW + protocol.NOTICE_MAX_S + 3600, "scheduled event Redeploy")
    assert w.update(far) is None
    assert w.again() is None
    clock.now += 7200
    assert w.update(far).in_s == protocol.NOTICE_MAX_S - 3600


# ---- from a stand-in metadata service ---------------------------------------------------------


@pytest.fixture
def cloud():
    with CloudMetadata() as server:
        yield server


def test_aws_asks_with_an_imdsv2_token_kept_between_polls(cloud):
    w = NoticeWatch("aws", url=cloud.url)
    assert w.check() is None  # 404: no notice
    cloud.aws_action = {"action": "terminate", "time": "2026-12-06T10:00:00Z"}
    assert w.check() == Notice(at("2026-12-06T10:00:00"), "spot instance-action terminate")
    assert cloud.tokens_issued == 1
    assert cloud.requests[0] == ("PUT", "/latest/api/token")


def test_aws_gets_a_new_token_when_the_old_one_is_refused(cloud):
    w = NoticeWatch("aws", url=cloud.url)
    assert w.check() is None
    w.cache["token"] = "expired"
    assert w.check() is UNKNOWN  # 401
    assert w.check() is None
    assert cloud.tokens_issued == 2


def test_aws_without_imdsv2_asks_without_a_token(cloud):
    cloud.aws_v2 = False
    cloud.aws_action = {"action": "stop", "time": "2026-12-06T10:00:00Z"}
    assert NoticeWatch("aws", url=cloud.url).check().reason == "spot instance-action stop"


def test_gcp_asks_both_keys_with_its_header(cloud):
    w = NoticeWatch("gcp", url=cloud.url)
    assert w.check() is None
    cloud.gcp_maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
    cloud.gcp_preempted = "TRUE"
    started = time.time()
    found = w.check()
    assert found.reason == "preempted"  # the sooner of the two
    assert found.deadline == pytest.approx(started + GCP_PREEMPT_S, abs=2)


def test_azure_asks_for_this_vms_events_only(cloud):
    w = NoticeWatch("azure", url=cloud.url)
    cloud.azure_events = [
        {**AZURE_PREEMPT["Events"][0], "Resources": ["gpu-vm-8"]},
    ]
    assert w.check() is None
    cloud.azure_events = AZURE_PREEMPT["Events"]
    assert w.check() == Notice(at("2026-12-06T09:58:30"), "scheduled event Preempt")
    # the VM's name is asked once
    names = [p for _m, p in cloud.requests if p.startswith("/metadata/instance/compute/name")]
    assert len(names) == 1


def test_an_unreachable_service_is_unknown_and_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="agentd.notice")
    w = NoticeWatch("aws", url="http://127.0.0.1:9", timeout_s=0.5)  # nothing listens
    assert w.check() is UNKNOWN
    assert w.check() is UNKNOWN
    lines = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(lines) == 1


def test_a_missing_file_is_no_notice_and_a_bad_one_unknown(tmp_path):
    path = tmp_path / "notice"
    w = NoticeWatch("file", file=path)
    assert w.check() is None
    path.write_text("in a bit")
    assert w.check() is UNKNOWN
    path.write_text('{"in_s": 90, "reason": "drain for the rack move"}')
    mtime = path.stat().st_mtime
    assert w.check() == Notice(mtime + 90, "drain for the rack move")
    time.sleep(0.05)
    assert w.check() == Notice(mtime + 90, "drain for the rack move")  # not moved by reading


# ---- in the agent ---------------------------------------------------------------------------


def _notices(agent) -> list[protocol.NodeNotice]:
    return [m for m in agent.outbox if m.type == "node_notice"]


async def _until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {check}")


async def test_a_spot_notice_from_the_stand_in_reaches_the_outbox(tmp_path, cloud):
    # given: an agent asking an AWS-shaped stand-in every 50 ms
    agent = make_agent(
        tmp_path, notice={"source": "aws", "url": cloud.url, "poll_interval_s": 0.05}
    )
    await agent.start()
    try:
        await asyncio.sleep(0.2)
        assert _notices(agent) == []
        # when: EC2 marks the instance for termination in two minutes
        deadline = datetime.fromtimestamp(time.time() + 120, UTC)
        cloud.aws_action = {"action": "terminate", "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}
        # then: one node_notice, about two minutes ahead, and only one
        [msg] = await _until(lambda: _notices(agent))
        assert msg.source == "aws" and msg.reason == "spot instance-action terminate"
        assert 115 <= msg.in_s <= 120
        assert protocol.parse_agent_message(protocol.dump(msg)) == msg
        key, sent = agent.outbox.first()
        agent.outbox.sent(key, sent)
        await asyncio.sleep(0.2)
        assert _notices(agent) == []
        # and after a registration it is said again
        agent.on_registered()
        assert [m.source for m in _notices(agent)] == ["aws"]
    finally:
        await agent.close()


async def test_a_notice_file_reaches_the_outbox(tmp_path):
    path = tmp_path / "going-away"
    agent = make_agent(
        tmp_path, notice={"source": "file", "file": str(path), "poll_interval_s": 0.05}
    )
    await agent.start()
    try:
        path.write_text('{"in_s": 300, "reason": "rack power work"}')
        os.utime(path, (time.time() - 100, time.time() - 100))  # written 100 s ago
        [msg] = await _until(lambda: _notices(agent))
        assert (msg.source, msg.reason) == ("file", "rack power work")
        assert 195 <= msg.in_s <= 200
    finally:
        await agent.close()


async def test_an_agent_without_a_source_asks_nothing(tmp_path):
    agent = make_agent(tmp_path)
    assert agent.notices is None


# ---- agent.yaml ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "notice, words",
    [
        ({"source": "oracle"}, "unknown source 'oracle' (known: aws, gcp, azure, file)"),
        ({"source": "file"}, "source file needs the file"),
        ({"source": "aws", "file": "/run/notice"}, "only means something with source file"),
        ({"source": "file", "file": "/x", "url": "http://x"}, "url: only means something"),
        ({"source": "aws", "url": "169.254.169.254"}, "must be an http(s):// URL"),
        ({"source": "aws", "poll_interval_s": 0}, "poll_interval_s"),
    ],
)
def test_a_bad_notice_setting_is_refused_naming_it(tmp_path, notice, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        make_agent(tmp_path, notice=notice)
