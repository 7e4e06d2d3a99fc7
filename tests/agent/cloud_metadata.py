"""A local stand-in for the clouds' metadata services, answering as each does.

One server on 127.0.0.1 serves the paths of all three (the agent's
``notice.url`` points at it): AWS IMDSv2 (a token from ``PUT
/latest/api/token``, required on every GET: 401 without), GCP (``Metadata-Flavor:
Google`` required: 403 without) and Azure (``Metadata: true`` required: 400
without). What each says is set on the server: ``aws_action`` (None: 404),
``gcp_preempted``, ``gcp_maintenance``, ``azure_events``, ``azure_name``.
Every request is recorded as (method, path).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# What IMDSv2 hands out: opaque, base64-like.
AWS_TOKEN = "AQAEAFB0b2tlbi1vZi10aGUtc3RhbmQtaW4="


class CloudMetadata(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str]] = []
        self.aws_action: dict | None = None
        self.aws_v2 = True  # False: the token PUT is refused (IMDSv1 only)
        self.tokens_issued = 0
        self.gcp_preempted = "FALSE"
        self.gcp_maintenance = "NONE"
        self.azure_events: list[dict] = []
        self.azure_name = "gpu-vm-7"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: CloudMetadata

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: str = "", kind: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        s = self.server
        s.requests.append(("PUT", self.path))
        if self.path != "/latest/api/token" or not s.aws_v2:
            return self._answer(403 if not s.aws_v2 else 404)
        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self._answer(400, "missing X-aws-ec2-metadata-token-ttl-seconds")
        s.tokens_issued += 1
        return self._answer(200, AWS_TOKEN)

    def do_GET(self):
        s = self.server
        s.requests.append(("GET", self.path))
        path = self.path
        if path.startswith("/latest/"):
            if s.aws_v2 and self.headers.get("X-aws-ec2-metadata-token") != AWS_TOKEN:
                return self._answer(401)
            if path == "/latest/meta-data/spot/instance-action":
                if s.aws_action is None:
                    return self._answer(404, "Not Found")
                return self._answer(200, json.dumps(s.aws_action), "application/json")
        elif path.startswith("/computeMetadata/v1/"):
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._answer(403, "Missing Metadata-Flavor:Google header.")
            if path == "/computeMetadata/v1/instance/preempted":
                return self._answer(200, s.gcp_preempted)
            if path == "/computeMetadata/v1/instance/maintenance-event":
                return self._answer(200, s.gcp_maintenance)
        elif path.startswith("/metadata/"):
            if self.headers.get("Metadata") != "true":
                error = {"error": "Bad request. Required metadata header not specified"}
                return self._answer(400, json.dumps(error), "application/json")
            if path.startswith("/metadata/scheduledevents?api-version="):
                body = {"DocumentIncarnation": len(s.azure_events), "Events": s.azure_events}
                return self._answer(200, json.dumps(body), "application/json")
            if path.startswith("/metadata/instance/compute/name?"):
                return self._answer(200, s.azure_name)
        return self._answer(404, "Not Found")
