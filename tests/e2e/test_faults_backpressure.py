"""Reliability row 9: back-pressure from an engine flooding its logs while a page follows them.

An engine (the fake one, ``--log-flood``) writes thousands of lines a second;
an operator's page follows its log, asking the node again and again for the
last 1,000 lines (the console's logs fragment: a logs request over the
channel layer and the agent's socket, a reply of some 200 KB back). Meanwhile
the node's desired set changes again and again, and each change must still
reach the agent and be acknowledged quickly: the same socket, the same Daphne
and the same channel layer carry both. Nothing may fail on a full channel.
"""

import copy
import re
import statistics
import sys
import threading
import time

import pytest
import requests
from django.contrib.auth import get_user_model
from django.urls import reverse

from fleet.models import Node
from fleet.services.desired import bump_desired
from tests.e2e.helpers import wait_serving
from tests.processes import Load, tails

pytestmark = pytest.mark.django_db(transaction=True)

FLOOD_LINES_PER_S = 2000
LINE_BYTES = 200
PAGE_LINES = 1000  # the most the console's logs fragment asks for
FOLLOWERS = 2  # pages following the log, each asking again as soon as it is answered
CHANGES = 100
PASSWORD = "e2e-ops-password"
# What an unhandled full channel, or a socket it ended, leaves in a log.
PROBLEMS = {
    "ChannelFull": re.compile(r"ChannelFull"),
    "socket ended by an error": re.compile(r"agent socket ended by an error"),
    "socket rate-limited": re.compile(r"agent socket closed code=4029"),
    "exception in Daphne": re.compile(r"Exception inside application"),
}


def logged_in(stack) -> requests.Session:
    """A browser session of the staff user ``ops``, logged in through the admin's form."""
    user = get_user_model().objects.get(username="ops")
    user.set_password(PASSWORD)
    user.save()
    session = requests.Session()
    login = f"{stack.url}/admin/login/"
    page = session.get(login, timeout=30).text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = {"username": "ops", "password": PASSWORD, "csrfmiddlewaretoken": csrf}
    resp = session.post(f"{login}?next=/admin/", data=form, headers={"Referer": login}, timeout=30)
    assert resp.ok and "sessionid" in session.cookies, resp.text[-500:]
    return session


class Follow:
    """Pages asking for a log's last lines, each again as soon as it is answered."""

    def __init__(self, url: str, cookies, node_id: str, source: str, clients: int):
        self.url = url + reverse("console:node-logs", args=[node_id])
        self.params = {"source": source, "lines": PAGE_LINES}
        self.cookies = cookies
        self.pages: list[tuple[str, int, float]] = []  # (outcome, lines, seconds)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._follow, daemon=True) for _ in range(clients)]

    def _follow(self) -> None:
        session = requests.Session()
        session.cookies.update(self.cookies)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                resp = session.get(self.url, params=self.params, timeout=60)
                text = resp.text
            except requests.RequestException as exc:
                self.pages.append((type(exc).__name__, 0, time.monotonic() - started))
                continue
            lines = text.count("fake engine: flood line")
            if resp.status_code != 200:
                outcome = f"status {resp.status_code}"
            elif "did not answer" in text:
                outcome = "timeout"
            elif lines == 0:
                outcome = "no lines"
            else:
                outcome = "ok"
            self.pages.append((outcome, lines, time.monotonic() - started))

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(70)

    def wait_pages(self, count: int, stack) -> None:
        target = len(self.pages) + count
        stack.wait(lambda: len(self.pages) >= target, f"{count} more log pages", timeout=120)


def sync_once(node_id: str, stack) -> float:
    """A new desired version of the node, as every change makes (``bump_desired``): the
    seconds until the agent's ack of it is in the database."""
    started = time.monotonic()
    bump_desired([node_id])
    target = Node.objects.values_list("desired_version", flat=True).get(pk=node_id)
    while Node.objects.values_list("acked_version", flat=True).get(pk=node_id) < target:
        if time.monotonic() - started > 60:
            raise AssertionError(f"no ack of desired v{target} within 60 s{tails(stack.logs())}")
        time.sleep(0.005)
    return time.monotonic() - started


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def dropped_replies(stack) -> float:
    text = requests.get(f"{stack.url}/metrics", timeout=30).text
    found = re.search(r"^llmgw_agent_logs_replies_dropped_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def rings_through(stack, settings) -> None:
    """This process's channel layer on the stack's Redis, so what it rings (``bump_desired``)
    reaches the stack's Daphne, as a ring from a Celery worker does."""
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    for host in layers["default"]["CONFIG"]["hosts"]:
        host["address"] = stack.redis.url
    settings.CHANNEL_LAYERS = layers  # Channels builds its layer again from this


def test_an_engine_flooding_its_logs_and_a_page_following_them_keep_desired_sync_fast(
    stack, record, settings
):
    rings_through(stack, settings)
    # given: a node running the fake engine, which floods its log
    stack.add_agent("cpu-a", engines={"binaries": {"fake": sys.executable}})
    stack.wait(lambda: Node.objects.filter(pk="cpu-a", connected=True).exists(), "the agent")
    model = stack.api("post", "models/", json={"name": "flood", "desired_replicas": 1})
    flood = ["--log-flood", str(FLOOD_LINES_PER_S), "--log-flood-line-bytes", str(LINE_BYTES)]
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model["id"],
            "name": "fake",
            "engine": "fake",
            "model_path": str(stack.tmp / "fake-weights"),  # the fake engine loads nothing
            "args": flood,
        },
    )
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})
    (shard,) = wait_serving(stack, "flood")
    quiet = [sync_once("cpu-a", stack) for _ in range(10)]  # for comparison, unloaded
    page = logged_in(stack)

    with (
        Load(stack.url, stack.inference_key, model="flood", clients=2) as load,
        Follow(stack.url, page.cookies, "cpu-a", shard.pk, FOLLOWERS) as follow,
    ):
        follow.wait_pages(10, stack)
        # when: the node's desired set changes again and again while the page follows
        took = []
        for _ in range(CHANGES):
            took.append(sync_once("cpu-a", stack))
            time.sleep(0.1)
        follow.wait_pages(5, stack)
    figures = load.summary()

    pages = list(follow.pages)
    outcomes = {kind: sum(1 for p in pages if p[0] == kind) for kind in {p[0] for p in pages}}
    ok_pages = [p for p in pages if p[0] == "ok"]
    found = {name: 0 for name in PROBLEMS}
    for log in stack.logs():
        text = log.read_text(errors="replace")
        for name, pattern in PROBLEMS.items():
            found[name] += len(pattern.findall(text))
    p99 = percentile(took, 99)
    record(
        "9",
        flood_lines_per_s=FLOOD_LINES_PER_S,
        line_bytes=LINE_BYTES,
        followers=FOLLOWERS,
        pages=len(pages),
        page_outcomes=outcomes,
        lines_per_page=round(statistics.mean(p[1] for p in ok_pages)) if ok_pages else 0,
        mb_followed=round(sum(p[1] for p in ok_pages) * LINE_BYTES / 2**20),
        page_p50_s=round(percentile([p[2] for p in pages], 50), 3),
        changes=len(took),
        sync_p50_s=round(percentile(took, 50), 3),
        sync_p99_s=round(p99, 3),
        sync_max_s=round(max(took), 3),
        quiet_sync_p50_s=round(percentile(quiet, 50), 3),
        replies_dropped=dropped_replies(stack),
        log_problems=found,
        requests=figures["requests"],
        failed=figures["failed"],
        broken=figures["broken"],
    )
    assert p99 < 2, took
    assert found == {name: 0 for name in PROBLEMS}
    assert outcomes.get("ok", 0) == len(pages), outcomes
    assert figures["failed"] == figures["broken"] == 0, figures
    assert Node.objects.get(pk="cpu-a").connected
