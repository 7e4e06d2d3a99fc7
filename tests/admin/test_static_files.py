"""The admin's and the API's CSS and JavaScript come from the web process itself, with no
web server in front: any 404 on a static file a page names fails, and so does one served
uncompressed or without a far-future cache for its hashed name."""

import gzip
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from http.cookiejar import CookieJar

import pytest
from django.contrib.auth import get_user_model

from tests.processes import ROOT, free_port, start_web, subprocess_env

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

# The admin's index, a changelist, the console's cluster page and DRF's browsable
# API: their base templates between them name every stylesheet and script an
# operator's pages load.
PAGES = ["/admin/", "/admin/fleet/node/", "/admin/cluster/", "/api/v1/"]
# Django's manifest names: a 12-hex-digit hash of the content before the extension.
HASHED = re.compile(r"\.[0-9a-f]{12}\.\w+$")
YEAR_S = 365 * 24 * 3600
# WhiteNoise keeps no gzipped copy where it saves under 5%: DRF's 59-byte
# load-ajax-form.js. Anything this big compresses well.
COMPRESSIBLE_BYTES = 1024


class _StaticRefs(HTMLParser):
    """Every <link href> and <script src> under /static/."""

    def __init__(self):
        super().__init__()
        self.urls: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        url = a.get("href") if tag == "link" else a.get("src") if tag == "script" else None
        if url and url.startswith("/static/"):
            self.urls.add(url)


def static_refs(html: str) -> set[str]:
    parser = _StaticRefs()
    parser.feed(html)
    return parser.urls


def log_in(base: str, username: str, password: str) -> urllib.request.OpenerDirector:
    """An opener holding the session of a login through the admin's form, as a browser's."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    login = base + "/admin/login/"
    page = opener.open(login, timeout=10).read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = {"username": username, "password": password, "csrfmiddlewaretoken": csrf}
    with opener.open(
        urllib.request.Request(
            login + "?next=/admin/",
            urllib.parse.urlencode(form).encode(),
            headers={"Referer": login},
        ),
        timeout=10,
    ) as resp:
        assert urllib.parse.urlsplit(resp.url).path == "/admin/", "the login was refused"
    return opener


def _lower(headers) -> dict[str, str]:
    """Header names as uvicorn sends them, lower-case, whatever the server wrote."""
    return {name.lower(): value for name, value in headers.items()}


def fetch(opener, url: str, **headers) -> tuple[int, dict[str, str], bytes]:
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status, _lower(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, _lower(err.headers), err.read()


def test_every_static_file_a_page_names_is_served_compressed_and_cached(tmp_path):
    # given: a superuser, and a web process whose static files were collected afresh
    get_user_model().objects.create_superuser("root", password="pw-for-tests")
    server = start_web(tmp_path, LLMGW_STATE_DIR=tmp_path / "state")
    try:
        opener = log_in(server.url, "root", "pw-for-tests")
        refs: set[str] = set()
        for page in PAGES:
            status, _, body = fetch(opener, server.url + page, Accept="text/html")
            assert status == 200, f"{page}: {status}"
            refs |= static_refs(body.decode())
        assert any("/admin/css/base." in u for u in refs), refs
        assert any("/rest_framework/" in u for u in refs), refs
        assert any("/fleet/console." in u for u in refs), refs

        # when: a browser fetches each, accepting gzip
        wrong = []
        for url in sorted(refs):
            status, headers, body = fetch(opener, server.url + url, **{"Accept-Encoding": "gzip"})
            encoding = headers.get("content-encoding")
            max_age = re.search(r"max-age=(\d+)", headers.get("cache-control", ""))
            if status != 200:
                wrong.append(f"{url}: {status}")
            elif encoding not in ("gzip", "br") and len(body) >= COMPRESSIBLE_BYTES:
                wrong.append(f"{url}: served uncompressed (Content-Encoding {encoding})")
            elif not HASHED.search(url):
                wrong.append(f"{url}: no content hash in its name")
            elif not max_age or int(max_age[1]) < YEAR_S:
                wrong.append(f"{url}: Cache-Control {headers.get('cache-control')!r}")
            elif encoding == "gzip" and not gzip.decompress(body):
                wrong.append(f"{url}: empty")

        # then: every one is there, compressed, and cached for a year or more
        assert wrong == [], "\n".join(wrong)
    finally:
        server.stop()
    # and the web process said nothing about them (no warnings, no errors)
    assert "Warning" not in server.output() and "Error" not in server.output(), server.output()


def test_without_collected_static_files_the_web_process_refuses_to_start(tmp_path):
    # given: a state dir nobody ran collectstatic for
    state = tmp_path / "state"
    port = str(free_port())
    argv = ["llmgw_site.serve", "--host", "127.0.0.1", "--port", port]

    # when: the web process starts
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        env=subprocess_env(LLMGW_STATE_DIR=state),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    # then: it stops at once, naming the missing manifest and the command to run,
    # rather than serving every admin page as a 500
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert f"{state}/static/staticfiles.json is missing" in said
    assert "Run: python manage.py collectstatic --no-input" in said
