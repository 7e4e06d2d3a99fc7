"""agentd.fetch against a real HTTP server in this process: resume, verify, atomic rename,
the concurrency bound, the disk check, cancellation, sharing, and a hub repository."""

import asyncio
import fcntl
import hashlib
import os
import threading
import time

import pytest

from agentd import discovery
from agentd.fetch import sources, store
from agentd.fetch.fetcher import FetchCancelled, Fetcher, FetchError, FetchSettings
from tests.processes.weights_server import HubRepo, WeightsServer

DATA = os.urandom(300_000)


@pytest.fixture
def server():
    with WeightsServer() as srv:
        srv.files["models/tiny.gguf"] = DATA
        yield srv


def fetcher(tmp_path, **kw) -> Fetcher:
    kw.setdefault("stall_s", 10.0)
    # The test servers listen on loopback, which a node refuses unless it allows it.
    kw.setdefault("allow_networks", ("127.0.0.0/8",))
    return Fetcher(FetchSettings(roots=[tmp_path / "weights"], **kw))


class Progress:
    def __init__(self):
        self.seen: list[tuple[int, int | None]] = []

    async def __call__(self, done, total):
        self.seen.append((done, total))


async def wait_for(check, what: str, timeout: float = 30):
    """Poll until check() holds; a hang fails with what it waited for (not a timing check)."""
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


async def test_a_url_is_fetched_under_its_own_name_with_its_source_recorded(tmp_path, server):
    f = fetcher(tmp_path)
    src = sources.parse(server.url("models/tiny.gguf"))
    progress = Progress()

    path = await f.fetch(src, {}, "shard-a", progress)

    assert path.name == "tiny.gguf"
    assert path.read_bytes() == DATA
    assert progress.seen[-1] == (len(DATA), len(DATA))
    assert f.ready(src) == path
    # one entry, with its source; nothing partial left beside it
    [entry] = discovery.weights([tmp_path / "weights"], [])
    assert entry.path == str(path.parent)
    assert entry.source == src.text
    assert entry.last_used is None
    assert entry.size_bytes >= len(DATA)
    assert sorted(os.listdir(tmp_path / "weights")) == [path.parent.name]


async def test_a_partial_file_is_continued_with_a_range_request(tmp_path, server):
    # given half the file from an earlier agent
    src = sources.parse(server.url("models/tiny.gguf"))
    staging = store.staging_dir(tmp_path / "weights", src)
    staging.mkdir(parents=True)
    (staging / "tiny.gguf.partial").write_bytes(DATA[:120_000])

    path = await fetcher(tmp_path).fetch(src, {}, "shard-a", Progress())

    assert path.read_bytes() == DATA
    assert server.sent_once_done("/models/tiny.gguf") == len(DATA) - 120_000
    assert ("GET", "/models/tiny.gguf", "bytes=120000-") in server.requests
    assert not staging.exists()


async def test_a_wrong_sha256_fails_naming_both_and_removes_the_file(tmp_path, server):
    src = sources.parse(server.url("models/tiny.gguf"))
    wrong = "0" * 64

    with pytest.raises(FetchError) as err:
        await fetcher(tmp_path).fetch(src, {"tiny.gguf": wrong}, "shard-a", Progress())

    good = hashlib.sha256(DATA).hexdigest()
    assert f"sha256 mismatch for tiny.gguf: expected {wrong}, got {good}" in str(err.value)
    staging = store.staging_dir(tmp_path / "weights", src)
    assert not (staging / "tiny.gguf.partial").exists()
    assert discovery.weights([tmp_path / "weights"], []) == []


async def test_the_right_sha256_passes(tmp_path, server):
    src = sources.parse(server.url("models/tiny.gguf"))
    good = hashlib.sha256(DATA).hexdigest()
    path = await fetcher(tmp_path).fetch(src, {"tiny.gguf": good}, "shard-a", Progress())
    assert path.read_bytes() == DATA


async def test_a_checksum_for_a_file_the_source_lacks_is_refused(tmp_path, server):
    src = sources.parse(server.url("models/tiny.gguf"))
    with pytest.raises(FetchError, match="weights_sha256 names other.gguf, which .* does not have"):
        await fetcher(tmp_path).fetch(src, {"other.gguf": "a" * 64}, "shard-a", Progress())


async def test_a_missing_file_and_a_dead_server_fail_with_the_reason(tmp_path, server):
    f = fetcher(tmp_path)
    with pytest.raises(FetchError, match="answered 404"):
        await f.fetch(sources.parse(server.url("nope.gguf")), {}, "a", Progress())
    port = server.port
    server.close()
    gone = sources.parse(f"http://127.0.0.1:{port}/models/tiny.gguf")
    with pytest.raises(FetchError, match="cannot reach 127.0.0.1"):
        await f.fetch(gone, {}, "b", Progress())


async def test_the_engine_never_sees_a_partial_entry(tmp_path, server):
    # given a slow server
    server.rate = 200_000
    f = fetcher(tmp_path)
    src = sources.parse(server.url("models/tiny.gguf"))
    task = asyncio.ensure_future(f.fetch(src, {}, "shard-a", Progress()))
    await wait_for(lambda: server.sent["/models/tiny.gguf"] > 50_000, "bytes to flow")

    # then mid-download: no entry, no weights reported, nothing ready
    assert f.ready(src) is None
    assert discovery.weights([tmp_path / "weights"], []) == []
    assert not store.entry_dir(tmp_path / "weights", src).exists()
    await task
    assert f.ready(src) is not None


async def test_at_most_max_concurrent_fetches_move_at_once(tmp_path, server):
    for i in range(3):
        server.files[f"m{i}.gguf"] = DATA[:100_000]
    server.rate = 400_000

    async def run(limit):
        server.max_active = 0
        f = fetcher(tmp_path / str(limit), max_concurrent=limit)
        srcs = [sources.parse(server.url(f"m{i}.gguf")) for i in range(3)]
        await asyncio.gather(*(f.fetch(s, {}, "x", Progress()) for s in srcs))
        return server.max_active

    assert await run(1) == 1
    assert await run(3) > 1  # the bound, not the server, held it to one


async def test_no_room_fails_before_fetching_and_names_the_dir(tmp_path, server):
    server.declared["/models/tiny.gguf"] = 10**18  # the HEAD says 1 EB
    src = sources.parse(server.url("models/tiny.gguf"))
    with pytest.raises(FetchError) as err:
        await fetcher(tmp_path).fetch(src, {}, "a", Progress())
    assert str(err.value).startswith("needs 1000000.0 TB, ")
    assert f"free on {tmp_path / 'weights'}" in str(err.value)
    assert server.sent["/models/tiny.gguf"] == 0


async def test_cancelling_removes_the_partial_files(tmp_path, server):
    server.rate = 100_000
    f = fetcher(tmp_path)
    src = sources.parse(server.url("models/tiny.gguf"))
    task = asyncio.ensure_future(f.fetch(src, {}, "shard-a", Progress()))
    staging = store.staging_dir(tmp_path / "weights", src)
    await wait_for(lambda: (staging / "tiny.gguf.partial").exists(), "the partial file")

    f.release(src.text, "shard-a")

    with pytest.raises(FetchCancelled):
        await task
    assert not staging.exists()
    assert os.listdir(tmp_path / "weights") == []


async def test_two_wanters_share_one_fetch_and_one_leaving_does_not_stop_it(tmp_path, server):
    server.rate = 300_000
    f = fetcher(tmp_path)
    src = sources.parse(server.url("models/tiny.gguf"))
    a = asyncio.ensure_future(f.fetch(src, {}, "shard-a", Progress()))
    b = asyncio.ensure_future(f.fetch(src, {}, "shard-b", Progress()))
    await wait_for(lambda: server.sent["/models/tiny.gguf"] > 0, "bytes to flow")

    f.release(src.text, "shard-a")

    path = await b
    assert path.read_bytes() == DATA
    assert server.sent_once_done("/models/tiny.gguf") == len(DATA)  # fetched once
    assert (await a) == path  # the first caller's await was not torn down either


async def test_a_stopped_agent_keeps_its_partial_file(tmp_path, server):
    server.rate = 100_000
    f = fetcher(tmp_path)
    src = sources.parse(server.url("models/tiny.gguf"))
    task = asyncio.ensure_future(f.fetch(src, {}, "shard-a", Progress()))
    partial = store.staging_dir(tmp_path / "weights", src) / "tiny.gguf.partial"
    await wait_for(lambda: partial.exists() and partial.stat().st_size > 0, "bytes on disk")

    await f.close()

    assert task.done()
    assert partial.stat().st_size > 0


async def test_a_hub_repository_is_fetched_and_checked_against_the_hub(tmp_path, server):
    config = b'{"architectures": ["LlamaForCausalLM"]}'
    server.repos["org/tiny"] = HubRepo("org/tiny", {"config.json": config, "model.gguf": DATA})
    f = fetcher(tmp_path, hf_endpoint=server.base)
    src = sources.parse("hf://org/tiny")

    path = await f.fetch(src, {}, "a", Progress())

    assert (path / "config.json").read_bytes() == config
    assert (path / "model.gguf").read_bytes() == DATA
    assert store.read_meta(path)["commit"] == server.repos["org/tiny"].commit
    [entry] = discovery.weights([tmp_path / "weights"], [])
    assert entry.source == "hf://org/tiny"


async def test_a_hub_file_or_folder_is_fetched_alone(tmp_path, server):
    # given: a repository of quantizations, one of them split in two parts in a folder
    files = {
        "README.md": b"# quants\n",
        "tiny-Q4_K_M.gguf": DATA[:1000],
        "tiny-Q8_0.gguf": DATA,
        "Q8_0/tiny-Q8_0-00001-of-00002.gguf": DATA[:500],
        "Q8_0/tiny-Q8_0-00002-of-00002.gguf": DATA[500:],
    }
    repo = HubRepo("org/tiny-GGUF", files)
    server.repos[repo.repo] = repo
    f = fetcher(tmp_path, hf_endpoint=server.base)

    # when: a profile names one file; then only that file comes, and the engine gets it
    path = await f.fetch(sources.parse("hf://org/tiny-GGUF/tiny-Q4_K_M.gguf"), {}, "a", Progress())
    assert path.name == "tiny-Q4_K_M.gguf" and path.read_bytes() == DATA[:1000]
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith(".")) == [
        "tiny-Q4_K_M.gguf"
    ]
    gets = [r[1] for r in server.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert [g.rsplit("/", 1)[-1] for g in gets] == ["tiny-Q4_K_M.gguf"]

    # and the first part of a split file brings the other part beside it
    first = "Q8_0/tiny-Q8_0-00001-of-00002.gguf"
    path = await f.fetch(sources.parse(f"hf://org/tiny-GGUF/{first}"), {}, "b", Progress())
    assert path.read_bytes() == DATA[:500]
    assert (path.parent / "tiny-Q8_0-00002-of-00002.gguf").read_bytes() == DATA[500:]
    assert not (path.parent.parent / "tiny-Q8_0.gguf").exists()

    # and a folder brings what is under it, not a file whose name starts the same
    folder = await f.fetch(sources.parse("hf://org/tiny-GGUF/Q8_0"), {}, "d", Progress())
    assert sorted(p.name for p in folder.iterdir()) == [
        "tiny-Q8_0-00001-of-00002.gguf",
        "tiny-Q8_0-00002-of-00002.gguf",
    ]
    with pytest.raises(FetchError, match=r"no file or folder 'Q8'"):
        await f.fetch(sources.parse("hf://org/tiny-GGUF/Q8"), {}, "e", Progress())

    # and a path the repository does not have is an error that lists what it has
    with pytest.raises(FetchError, match=r"no file or folder 'tiny-Q5.gguf' .* \(it has: Q8_0/"):
        await f.fetch(sources.parse("hf://org/tiny-GGUF/tiny-Q5.gguf"), {}, "c", Progress())
    # as is a later part of a split file, which names the first
    second = "Q8_0/tiny-Q8_0-00002-of-00002.gguf"
    with pytest.raises(FetchError, match=r"part 2 of a split GGUF; name its first part"):
        await f.fetch(sources.parse(f"hf://org/tiny-GGUF/{second}"), {}, "f", Progress())
    assert sorted(e.source for e in discovery.weights([tmp_path / "weights"], [])) == [
        "hf://org/tiny-GGUF/Q8_0",
        f"hf://org/tiny-GGUF/{first}",
        "hf://org/tiny-GGUF/tiny-Q4_K_M.gguf",
    ]


@pytest.mark.parametrize("name", ["model.gguf", "config.json"])
async def test_a_hub_file_that_does_not_match_its_checksum_fails(tmp_path, server, name):
    # LFS files are checked against their sha256, others against their git object id
    files = {"config.json": b"{}", "model.gguf": DATA}
    server.repos["org/tiny"] = HubRepo("org/tiny", files)
    commit = server.repos["org/tiny"].commit
    server.corrupt.add(f"/org/tiny/resolve/{commit}/{name}")
    f = fetcher(tmp_path, hf_endpoint=server.base)

    with pytest.raises(FetchError, match=f"mismatch for {name}: expected"):
        await f.fetch(sources.parse("hf://org/tiny"), {}, "a", Progress())


async def test_a_missing_hub_repository_or_revision_is_named(tmp_path, server):
    server.repos["org/tiny"] = HubRepo("org/tiny", {"model.gguf": DATA})
    f = fetcher(tmp_path, hf_endpoint=server.base)
    with pytest.raises(FetchError, match="no such repository"):
        await f.fetch(sources.parse("hf://org/other"), {}, "a", Progress())
    with pytest.raises(FetchError, match="no revision 'v9'"):
        await f.fetch(sources.parse("hf://org/tiny@v9"), {}, "a", Progress())


def test_last_use_is_recorded_in_the_entry_and_reported(tmp_path):
    entry = tmp_path / "weights" / "e"
    entry.mkdir(parents=True)
    store.write_meta(entry, {"source": "https://h/x.gguf", "last_used": None})

    assert store.touch(entry, now=1000.0)
    assert not store.touch(entry, now=1100.0, every=600)  # too soon to write again
    assert store.touch(entry, now=1700.0, every=600)

    [w] = discovery.weights([tmp_path / "weights"], [])
    assert (w.source, w.last_used) == ("https://h/x.gguf", 1700.0)


def test_an_entry_two_engines_record_their_use_of_at_once_is_always_found(tmp_path):
    # given an entry whose use two engines starting together record from two threads
    source = sources.parse("https://h/x.gguf")
    entry = store.entry_dir(tmp_path, source)
    entry.mkdir()
    store.write_meta(entry, {"source": source.text, "last_used": 0, "files": ["x" * 100] * 100})
    done = threading.Event()

    def record_use():
        while not done.is_set():
            store.touch(entry)

    writers = [threading.Thread(target=record_use) for _ in range(2)]
    for t in writers:
        t.start()
    # when the agent looks for it meanwhile (a shard's start, the weights it reports)
    try:
        missed = sum(store.find([tmp_path], source) is None for _ in range(2000))
    finally:
        done.set()
        for t in writers:
            t.join()
    # then it is there every time: never a half-written metadata file
    assert missed == 0


def test_http_download_stops_when_cancelled(tmp_path, server):
    from agentd.fetch import http

    server.rate = 50_000
    cancel = threading.Event()
    seen = []

    def on_bytes(n):
        seen.append(n)
        if n > 0:
            cancel.set()

    with pytest.raises(http.Cancelled):
        http.download(server.url("models/tiny.gguf"), tmp_path / "x.partial", cancel=cancel,
                      on_bytes=on_bytes)  # fmt: skip
    assert (tmp_path / "x.partial").stat().st_size < len(DATA)


async def test_a_checksum_added_after_the_fetch_is_checked_against_the_copy(tmp_path, server):
    f = fetcher(tmp_path)
    src = sources.parse(server.url("models/tiny.gguf"))
    path = await f.fetch(src, {}, "a", Progress())
    good = hashlib.sha256(DATA).hexdigest()

    assert f.ready(src, {"tiny.gguf": good}) == path
    assert store.read_meta(path.parent)["sha256"] == {"tiny.gguf": good}
    with pytest.raises(FetchError, match=f"has sha256 {good}, the profile expects {'1' * 64}"):
        f.ready(src, {"tiny.gguf": "1" * 64})


def test_llamacpp_loads_the_one_gguf_of_a_fetched_repository(tmp_path):
    from agentd.engines.base import EngineUnavailable
    from agentd.engines.llamacpp import gguf_in

    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "config.json").write_text("{}")
    (repo / "sub" / "m-00001-of-00002.gguf").write_bytes(b"x")
    (repo / "sub" / "m-00002-of-00002.gguf").write_bytes(b"x")
    assert gguf_in(str(repo)) == str(repo / "sub" / "m-00001-of-00002.gguf")
    assert gguf_in("/models/x.gguf") == "/models/x.gguf"  # a file is left alone

    (repo / "other.gguf").write_bytes(b"x")
    with pytest.raises(EngineUnavailable, match="holds 2 .gguf files .*name that file"):
        gguf_in(str(repo))


async def test_https_with_the_sites_ca_and_not_without_it(tmp_path):
    from tests.processes.tls import CA

    ca = CA.create(tmp_path / "ca", name="weights mirror CA")
    with WeightsServer(tls=ca.issue("127.0.0.1", server=True)) as srv:
        srv.files["tiny.gguf"] = DATA
        src = sources.parse(srv.url("tiny.gguf"))
        assert src.url.startswith("https://")

        with pytest.raises(
            FetchError, match="TLS with 127.0.0.1:.* failed: CERTIFICATE_VERIFY_FAILED"
        ):
            await fetcher(tmp_path / "a").fetch(src, {}, "a", Progress())
        path = await fetcher(tmp_path / "b", ca_file=str(ca.pem)).fetch(src, {}, "a", Progress())
        assert path.read_bytes() == DATA


async def test_a_resumed_download_is_checked_as_a_whole(tmp_path, server):
    # the checksum covers the part fetched earlier too: a wrong prefix is caught
    src = sources.parse(server.url("models/tiny.gguf"))
    good = hashlib.sha256(DATA).hexdigest()
    staging = store.staging_dir(tmp_path / "weights", src)
    staging.mkdir(parents=True)
    (staging / "tiny.gguf.partial").write_bytes(b"\0" * 1000)

    with pytest.raises(FetchError, match="sha256 mismatch"):
        await fetcher(tmp_path).fetch(src, {"tiny.gguf": good}, "a", Progress())

    (staging / "tiny.gguf.partial").write_bytes(DATA[:1000])
    path = await fetcher(tmp_path).fetch(src, {"tiny.gguf": good}, "a", Progress())
    assert path.read_bytes() == DATA
    assert store.read_meta(path.parent)["sha256"] == {"tiny.gguf": good}


async def test_a_server_that_ignores_range_gets_the_file_fetched_whole(tmp_path, server):
    server.ignore_range = True
    src = sources.parse(server.url("models/tiny.gguf"))
    staging = store.staging_dir(tmp_path / "weights", src)
    staging.mkdir(parents=True)
    (staging / "tiny.gguf.partial").write_bytes(b"\0" * 5000)  # not even a true prefix
    good = hashlib.sha256(DATA).hexdigest()

    path = await fetcher(tmp_path).fetch(src, {"tiny.gguf": good}, "a", Progress())

    assert path.read_bytes() == DATA
    assert server.sent_once_done("/models/tiny.gguf") == len(DATA)


def _staged(root, source_text: str, age_s: float):
    """A fetch that stopped ``age_s`` ago, its partial file left for a resume."""
    staging = store.staging_dir(root, sources.parse(source_text))
    staging.mkdir(parents=True)
    partial = staging / f"model.gguf{store.PARTIAL}"
    partial.write_bytes(b"x" * 1000)
    then = time.time() - age_s
    for path in (partial, staging):
        os.utime(path, (then, then))
    return staging


def test_a_partial_fetch_nobody_resumed_for_a_day_is_removed_and_the_rest_kept(tmp_path):
    day = store.ABANDONED_AFTER_S
    abandoned = _staged(tmp_path, "https://example.com/a/model.gguf", day + 3600)
    recent = _staged(tmp_path, "https://example.com/b/model.gguf", day - 3600)
    busy = _staged(tmp_path, "https://example.com/c/model.gguf", day + 3600)
    entry = tmp_path / "old-entry"  # complete weights: the control plane's to clean up
    entry.mkdir()
    os.utime(entry, (time.time() - 10 * day,) * 2)
    # another agent on the shared filesystem is fetching c right now
    fd = os.open(busy.with_name(busy.name + ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        removed = store.sweep_abandoned([tmp_path])
    finally:
        os.close(fd)

    assert removed == [abandoned]
    assert not abandoned.exists()
    assert not abandoned.with_name(abandoned.name + ".lock").exists()
    assert recent.is_dir() and busy.is_dir() and entry.is_dir()
