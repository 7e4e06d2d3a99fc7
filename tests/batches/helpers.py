"""The batch tests' vocabulary: teams and keys, input files, and a stand-in gateway that
answers batch lines and counts what it was sent."""

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.contrib.auth.models import Group

from fleet.models import Team
from fleet.services.batches import credentials
from tests.factories import inference_key


def team(name: str) -> Team:
    return Team.objects.create(name=name, group=Group.objects.create(name=name))


def key(name: str, team_row=None):
    """(ApiKey, secret) of an inference key, of ``team_row`` if given."""
    return inference_key(name, team=team_row)


def jsonl(n: int, model: str = "tiny", url: str = "/v1/chat/completions") -> bytes:
    out = []
    for i in range(1, n + 1):
        if url == "/v1/chat/completions":
            body = {"model": model, "messages": [{"role": "user", "content": f"q{i}"}]}
            body["max_tokens"] = 4
        elif url == "/v1/responses":
            body = {"model": model, "input": f"q{i}", "max_output_tokens": 4}
        else:
            body = {"model": model, "input": f"q{i}"}
        out.append(json.dumps({"custom_id": f"q-{i}", "method": "POST", "url": url, "body": body}))
    return ("\n".join(out) + "\n").encode()


class StubGateway:
    """Answers POST /v1/* like the gateway: a chat completion naming the question, or what
    ``script(custom question, nth time asked)`` returns as (status, body dict, headers).
    Counts the times each question was asked and the keys (digests) that asked."""

    def __init__(self, script=None):
        self.script = script
        self.asked: Counter = Counter()
        self.digests: set = set()
        self.lock = threading.Lock()
        self.gate = threading.Event()  # cleared: answers wait for it
        self.gate.set()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                token = self.headers["Authorization"].removeprefix("Bearer ")
                question = body["messages"][0]["content"] if "messages" in body else body["input"]
                with stub.lock:
                    stub.asked[question] += 1
                    nth = stub.asked[question]
                    stub.digests.add(credentials.key_digest(token))
                stub.gate.wait(30)
                status, answer, headers = 200, None, {}
                if stub.script is not None:
                    status, answer, headers = stub.script(question, nth) or (200, None, {})
                if answer is None:
                    answer = {
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [
                            {"message": {"role": "assistant", "content": f"re {question}"}}
                        ],
                    }
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
