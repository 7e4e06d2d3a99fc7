"""Weights named by URL or hub repository, fetched by the node over real processes: a local
server the test runs serves the tiny GGUF (with Range and a throttle), the agent fetches it
with progress, resumes after a SIGKILL, refuses a wrong checksum, drops a fetch nobody wants,
and the replica serves through the gateway."""

import re

import pytest

from agentd.fetch import store
from fleet.models import LocalWeights, Node, Replica, Shard
from tests.e2e.helpers import apply_model, wait_serving
from tests.processes.weights_server import HubRepo, WeightsServer

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/models/tiny-llama.gguf"


@pytest.fixture
def server(tiny_model):
    with WeightsServer() as srv:
        srv.files[PATH.lstrip("/")] = tiny_model.read_bytes()
        yield srv


def registered(node_id):
    return Node.objects.filter(pk=node_id, connected=True, registered_at__isnull=False).first()


def fetching_shard(lo: int, hi: int):
    """The model's shard while it is starting with between lo and hi bytes fetched."""
    return Shard.objects.filter(
        replica__model__name="tiny-llama",
        state="starting",
        fetch_bytes_done__gte=lo,
        fetch_bytes_done__lt=hi,
    ).first()


def node_with_weights(stack, tmp_path, node_id="cpu-a", allow_loopback=True):
    """A node with a weights dir; it fetches from the test's server on 127.0.0.1 only
    because its agent.yaml allows loopback (fetch.allow_networks)."""
    weights = tmp_path / f"{node_id}-weights"
    fetch = {"allow_networks": ["127.0.0.0/8"]} if allow_loopback else {}
    agent = stack.add_agent(node_id, weights_dirs=[str(weights)], fetch=fetch)
    stack.wait(lambda: registered(node_id), "the agent to register")
    return agent, weights


def test_weights_on_an_internal_address_are_refused_unless_the_node_allows_it(
    stack, tmp_path, server
):
    # given: a node whose agent.yaml allows no internal address
    _, weights = node_with_weights(stack, tmp_path, allow_loopback=False)

    # when: a profile names weights on 127.0.0.1
    apply_model(stack, server.url(PATH))

    # then: the shard fails with the reason, naming the setting to change
    replica = stack.wait(
        lambda: Replica.objects.filter(reason__contains="a loopback address").first(),
        "the replica to fail with the node's refusal",
    )
    assert (
        f"{server.url(PATH)}: 127.0.0.1 is 127.0.0.1, a loopback address; this node fetches "
        "from internal addresses only where its agent.yaml allows them "
        "(fetch.allow_private_addresses, or its network in fetch.allow_networks)"
    ) in replica.reason
    # and the agent asked the server nothing (the control plane's estimate reads the
    # header in closed ranges from 0: fleet/services/estimate.py) and wrote nothing
    asked = [r for r in server.requests if not re.fullmatch(r"bytes=0-\d+", r[2])]
    assert asked == []
    assert not weights.exists() or list(weights.iterdir()) == []


def test_a_url_is_fetched_with_progress_and_the_replica_serves(stack, tmp_path, server):
    size = len(server.files[PATH.lstrip("/")])
    server.rate = size // 4  # about four seconds
    agent, weights = node_with_weights(stack, tmp_path)

    apply_model(stack, server.url(PATH))

    # progress arrives while the shard is starting, and is stored on it
    mid = stack.wait(lambda: fetching_shard(1, size), "fetch progress part way")
    assert (mid.fetch_source, mid.fetch_bytes_total) == (server.url(PATH), size)
    [listed] = stack.api("get", "shards/", params={"node": "cpu-a"})["results"]
    assert listed["fetch_source"] == server.url(PATH)
    assert 0 < listed["fetch_bytes_done"] < size and listed["fetch_bytes_total"] == size

    (shard,) = wait_serving(stack)
    # the same shard, never failed on the way: a fetch is not a transition
    assert shard.pk == mid.pk
    done = Shard.objects.get(pk=shard.pk)
    assert (done.fetch_bytes_done, done.fetch_bytes_total) == (size, size)
    # the engine was given the local copy, fetched once
    [local] = weights.glob("*/tiny-llama.gguf")
    cmdline = open(f"/proc/{agent.engines()[shard.pk]}/cmdline").read().split("\0")
    assert str(local) in cmdline
    assert server.sent_once_done(PATH) == size
    # its metadata says where it came from and that an engine used it
    meta = store.read_meta(local.parent)
    assert meta["source"] == server.url(PATH) and meta["last_used"] is not None
    # and the node reports the entry in its weights
    stack.wait(
        lambda: LocalWeights.objects.filter(node_id="cpu-a", path=str(local.parent)).exists(),
        "the fetched entry in the node's weights",
    )


def test_an_agent_killed_half_way_resumes_the_download(stack, tmp_path, server):
    size = len(server.files[PATH.lstrip("/")])
    server.rate = size // 8  # about eight seconds
    agent, weights = node_with_weights(stack, tmp_path)
    apply_model(stack, server.url(PATH))
    stack.wait(lambda: server.sent[PATH] >= size // 2, "half the file to be sent")

    # when: the agent dies mid-download, and comes back
    agent.kill_9()
    [partial] = weights.glob(".fetch-*/tiny-llama.gguf.partial")
    have = partial.stat().st_size
    assert 0 < have < size
    before = len(server.requests)
    agent.start()

    # then: it asks for the rest only, and the replica serves
    (shard,) = wait_serving(stack)
    # (the control plane's estimate reads the header meanwhile, in closed ranges from 0:
    # fleet/services/estimate.py; the agent asks for open ranges)
    again = [
        r
        for r in server.requests[before:]
        if r[0] == "GET" and r[1] == PATH and not re.fullmatch(r"bytes=0-\d+", r[2])
    ]
    assert again == [("GET", PATH, f"bytes={have}-")]
    [local] = weights.glob("*/tiny-llama.gguf")
    assert local.stat().st_size == size
    # the shard that was fetching is the one that serves: nothing failed or restarted
    assert not Shard.objects.filter(state="failed").exists()
    assert Replica.objects.get().restarts == 0
    assert shard.fetch_bytes_total == size


def test_a_wrong_sha256_fails_the_start_with_that_reason(stack, tmp_path, server, tiny_model):
    import hashlib

    _, weights = node_with_weights(stack, tmp_path)
    wrong = "0" * 64
    good = hashlib.sha256(tiny_model.read_bytes()).hexdigest()

    # the checksum is on the profile from the start: patched in later, it could arrive
    # after the agent had fetched the file unchecked, and the fetch would not fail
    checksums = {"weights_sha256": {"tiny-llama.gguf": wrong}}
    apply_model(stack, server.url(PATH), profile_fields=checksums)

    expected = f"sha256 mismatch for tiny-llama.gguf: expected {wrong}, got {good}"
    replica = stack.wait(
        lambda: Replica.objects.filter(reason__contains=expected).first(),
        "the replica to fail with the checksum mismatch",
    )
    assert "fetching weights failed" in replica.reason
    assert not list(weights.glob("*/tiny-llama.gguf"))  # never became weights
    assert not list(weights.glob(".fetch-*/*.gguf*"))  # and the bad file is gone


def test_a_fetch_nobody_wants_is_cancelled_and_its_partial_file_removed(stack, tmp_path, server):
    size = len(server.files[PATH.lstrip("/")])
    server.rate = size // 30  # far longer than the test
    _, weights = node_with_weights(stack, tmp_path)
    model_id = apply_model(stack, server.url(PATH))
    stack.wait(lambda: list(weights.glob(".fetch-*/*.partial")), "the partial file")

    # when: the model is scaled to zero
    stack.api("patch", f"models/{model_id}/", json={"desired_replicas": 0})

    # then: the fetch stops and leaves nothing behind
    stack.wait(lambda: not list(weights.glob(".fetch-*")), "the staging dir to go")
    assert list(weights.iterdir()) == []
    assert server.sent[PATH] < size


def test_an_hf_repository_is_fetched_through_the_hub_api(stack, tmp_path, server, tiny_model):
    files = {"README.md": b"# tiny\n", "tiny-llama.gguf": tiny_model.read_bytes()}
    repo = HubRepo("llmgw/tiny-llama-GGUF", files)
    server.repos[repo.repo] = repo
    weights = tmp_path / "hub-weights"
    hub = {"hf_endpoint": server.base}
    agent = stack.add_agent("cpu-a", weights_dirs=[str(weights)], fetch=hub)
    stack.wait(lambda: registered("cpu-a"), "the agent to register")

    apply_model(stack, f"hf://{repo.repo}@{repo.commit}")

    (shard,) = wait_serving(stack)
    [entry] = weights.glob("hf--llmgw--tiny-llama-GGUF--*")
    assert (entry / "README.md").read_bytes() == b"# tiny\n"
    cmdline = open(f"/proc/{agent.engines()[shard.pk]}/cmdline").read().split("\0")
    assert str(entry / "tiny-llama.gguf") in cmdline
    # the files came from the hub's resolve endpoint at the pinned commit
    gets = {r[1] for r in server.requests if r[0] == "GET"}
    assert f"/{repo.repo}/resolve/{repo.commit}/tiny-llama.gguf" in gets
    assert f"/api/models/{repo.repo}/revision/{repo.commit}" in gets


def test_one_file_of_an_hf_repository_is_fetched_alone(stack, tmp_path, server, tiny_model):
    # given: a repository of two quantizations, as GGUF repositories on the hub are
    data = tiny_model.read_bytes()
    files = {"README.md": b"# quants\n", "tiny-Q4_K_M.gguf": data, "tiny-Q8_0.gguf": data}
    repo = HubRepo("llmgw/tiny-llama-GGUF", files)
    server.repos[repo.repo] = repo
    weights = tmp_path / "hub-weights"
    agent = stack.add_agent(
        "cpu-a", weights_dirs=[str(weights)], fetch={"hf_endpoint": server.base}
    )
    stack.wait(lambda: registered("cpu-a"), "the agent to register")

    # when: the profile names one of them
    apply_model(stack, f"hf://{repo.repo}/tiny-Q8_0.gguf@{repo.commit}")

    # then: llama.cpp serves that file, and the other quantization never came
    (shard,) = wait_serving(stack)
    [entry] = weights.glob("hf--llmgw--tiny-llama-GGUF--tiny-Q8_0.gguf--*")
    cmdline = open(f"/proc/{agent.engines()[shard.pk]}/cmdline").read().split("\0")
    assert str(entry / "tiny-Q8_0.gguf") in cmdline
    assert sorted(p.name for p in entry.iterdir() if not p.name.startswith(".")) == [
        "tiny-Q8_0.gguf"
    ]
    gets = {r[1] for r in server.requests if r[0] == "GET"}
    assert f"/{repo.repo}/resolve/{repo.commit}/tiny-Q8_0.gguf" in gets
    assert not [g for g in gets if g.endswith(("tiny-Q4_K_M.gguf", "README.md"))]
    # and the control plane knows the entry by the file's source
    row = LocalWeights.objects.get(node_id="cpu-a")
    assert row.source == f"hf://{repo.repo}/tiny-Q8_0.gguf@{repo.commit}"
