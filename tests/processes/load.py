"""A steady load of chat completions through the gateway, every request's outcome kept.

``Load`` runs N client threads, each sending chat completions one after another
(every other one streamed, by default) over raw HTTP with keep-alive, until
stopped, at most ``rate_per_s`` a second each (10 by default): a steady load
that keeps requests in flight through a fault without taking the machine's
cores from the processes under test (two, in CI). A test that needs a flood,
such as a load step for the autoscaler, passes ``rate_per_s=None``. Each
request ends as one ``Outcome``:

- ``ok``: a 200 with a complete answer (a stream ended by ``data: [DONE]``);
- ``failed``: no answer (a connect error, a timeout before the headers) or a
  status other than 200, which is kept;
- ``broken``: a stream that began (200) and did not end well: cut off before
  ``[DONE]``, or carrying an error event.

A fault test wraps its fault in ``with Load(...) as load:`` and asserts on
``load.summary()``, whose counts also go into docs/reliability.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass

import requests


@dataclass
class Outcome:
    kind: str  # ok, failed, broken
    streamed: bool
    started: float  # time.monotonic()
    ended: float
    status: int | None = None
    detail: str = ""


class Load:
    """``clients`` threads sending requests to ``{url}/v1/chat/completions`` until stopped."""

    def __init__(
        self,
        url: str,
        api_key: str,
        model: str = "tiny-llama",
        clients: int = 4,
        stream_every: int = 2,
        max_tokens: int = 8,
        rate_per_s: float | None = 10.0,
        pause_s: float = 0.0,
        failure_pause_s: float = 0.25,
        timeout_s: float = 30,
    ):
        self.url = f"{url}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.model = model
        self.clients = clients
        self.stream_every = stream_every  # every n-th request is streamed (0: none)
        self.max_tokens = max_tokens
        # A client starts a request at most every 1 / rate_per_s seconds.
        self.interval_s = 1.0 / rate_per_s if rate_per_s else 0.0
        self.pause_s = pause_s
        # A client waits this long after a failure before its next request, as
        # client libraries do, so a gateway that is down is not counted in a
        # tight loop of refused connects.
        self.failure_pause_s = failure_pause_s
        self.timeout_s = timeout_s
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)
        ]
        self.started: float | None = None
        self.stopped: float | None = None

    # ---- running -------------------------------------------------------------------

    def __enter__(self) -> Load:
        self.started = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 10)
        if self.stopped is None:
            self.stopped = time.monotonic()

    def wait_requests(self, count: int, timeout: float = 60) -> None:
        """Wait until ``count`` more requests have ended (so a phase has seen traffic)."""
        target = len(self.outcomes) + count
        deadline = time.monotonic() + timeout
        while len(self.outcomes) < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"the load ended {count} requests within {timeout:g} s")
            time.sleep(0.05)

    def _client(self, index: int) -> None:
        session = requests.Session()
        n = index  # clients start out of step, so both kinds run at once
        while not self._stop.is_set():
            streamed = bool(self.stream_every) and n % self.stream_every == 0
            n += 1
            outcome = self._one(session, streamed)
            pace = self.interval_s - (outcome.ended - outcome.started)
            with self._lock:
                self.outcomes.append(outcome)
            if outcome.kind != "ok":
                # A fresh connection after a failure, as a client library would.
                session.close()
                session = requests.Session()
                self._stop.wait(self.failure_pause_s)
            if self.pause_s or pace > 0:
                self._stop.wait(self.pause_s + max(pace, 0.0))
        session.close()

    def _one(self, session: requests.Session, streamed: bool) -> Outcome:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": self.max_tokens,
            "stream": streamed,
        }
        started = time.monotonic()

        def end(kind: str, status: int | None = None, detail: str = "") -> Outcome:
            return Outcome(kind, streamed, started, time.monotonic(), status, detail[:200])

        try:
            resp = session.post(
                self.url, json=body, headers=self.headers, timeout=self.timeout_s, stream=streamed
            )
        except requests.RequestException as exc:
            return end("failed", None, type(exc).__name__)
        with resp:
            if resp.status_code != 200:
                return end("failed", resp.status_code, resp.text[:200])
            if not streamed:
                try:
                    choices = resp.json()["choices"]
                except (ValueError, KeyError) as exc:
                    return end("failed", 200, f"not a completion: {exc}")
                return end("ok", 200) if choices else end("failed", 200, "no choices")
            return self._read_stream(resp, end)

    @staticmethod
    def _read_stream(resp: requests.Response, end) -> Outcome:
        # Read to the end of the body, past [DONE]: a client that hangs up at
        # [DONE] loses its keep-alive connection and shows in the gateway's log
        # as one that went away.
        chunks, done = 0, False
        try:
            for line in resp.iter_lines():
                if done or not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    return end("broken", 200, f"error event: {event['error']}")
                chunks += 1
        except (requests.RequestException, ValueError) as exc:
            return end("broken", 200, f"{type(exc).__name__} after {chunks} chunks")
        if not done:
            return end("broken", 200, f"ended without [DONE] after {chunks} chunks")
        if not chunks:
            return end("broken", 200, "[DONE] without a chunk")
        return end("ok", 200)

    # ---- results -------------------------------------------------------------------

    def count(self, kind: str, since: float | None = None, until: float | None = None) -> int:
        """Requests that ended as ``kind`` and were sent between ``since`` and ``until``."""
        return sum(
            1
            for o in list(self.outcomes)
            if o.kind == kind
            and (since is None or o.started >= since)
            and (until is None or o.started <= until)
        )

    def summary(self) -> dict:
        """Counts for a test's assertions and the reliability table."""
        outcomes = list(self.outcomes)
        kinds = Counter(o.kind for o in outcomes)
        seconds = (self.stopped or time.monotonic()) - (self.started or time.monotonic())
        problems = Counter(
            f"{o.kind} {o.status or ''} {o.detail}".strip() for o in outcomes if o.kind != "ok"
        )
        return {
            "requests": len(outcomes),
            "streamed": sum(1 for o in outcomes if o.streamed),
            "ok": kinds["ok"],
            "failed": kinds["failed"],
            "broken": kinds["broken"],
            "seconds": round(seconds, 1),
            "rate_per_s": round(len(outcomes) / seconds, 1) if seconds > 0 else 0.0,
            "problems": dict(problems.most_common(5)),
        }
