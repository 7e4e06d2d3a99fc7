"""Helpers for the admin, API and command tests: a fleet as agents report it, and forms."""

from datetime import timedelta
from html.parser import HTMLParser

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from agentd import protocol
from fleet.models import (
    ApiKeyScope,
    DesiredState,
    EngineProfile,
    Model,
    Node,
    NodeCredential,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)
from fleet.services import access, api_keys, heartbeat, inventory
from tests.fleet_helpers import heartbeat_msg, register_msg


def add_node(node_id="gpu-01", **overrides):
    """A node registered the way its agent would register it."""
    msg = protocol.parse_agent_message(register_msg(node_id, **overrides))
    return inventory.register_node(msg)


def report_load(node_id, *, cpu_percent=37.5, age=timedelta(0), shards=()):
    """A heartbeat carrying load, applied as if it arrived ``age`` ago."""
    hb = protocol.parse_agent_message(
        heartbeat_msg(
            load={
                "cpu_percent": cpu_percent,
                "cpu_count": 224,
                "load1": 3.5,
                "load5": 3.0,
                "load15": 2.5,
                "memory_used_bytes": 412 * 2**30,
                "memory_available_bytes": 1600 * 2**30,
                "shards": list(shards),
            }
        )
    )
    # Written as the node's agent would be: only a live credential's heartbeat is.
    cred = NodeCredential.objects.filter(node_id=node_id, revoked_at__isnull=True).first()
    if cred is None:
        cred, _ = NodeCredential.issue(node=Node.objects.get(pk=node_id))
    heartbeat.apply_heartbeats([(node_id, cred.pk, hb, timezone.now() - age)])


def add_model(name="qwen-7b", **profile):
    """A model with one llama.cpp CPU profile (overridable), active."""
    model = Model.objects.create(name=name, desired_replicas=1)
    fields = {"name": "cpu", "engine": "llamacpp", "model_path": f"/models/{name}.gguf"}
    fields.update(profile)
    prof = EngineProfile.objects.create(model=model, **fields)
    model.active_profile = prof
    model.save()
    return model, prof


def add_replica(model, profile, node_ids, state=ShardState.READY):
    """A replica with one shard per node, as the reconciler would have placed it."""
    replica = Replica.objects.create(
        model=model,
        profile=profile,
        state=ReplicaState.READY if state == ShardState.READY else ReplicaState.STARTING,
    )
    for rank, node_id in enumerate(node_ids):
        Shard.objects.create(
            replica=replica,
            node_id=node_id,
            rank=rank,
            port=8000 + rank,
            state=state,
            desired_state=DesiredState.RUNNING,
        )
    return replica


def enrol(node_id):
    """Enrol a node with a fresh join token; returns its credential secret."""
    _, secret = access.create_join_token("test", ttl=timedelta(hours=1))
    identity = access.identify(secret)
    _, credential = access.enrol(identity, node_id)
    return credential


def staff_user(username="ops", **fields):
    fields = {"is_staff": True, **fields}
    return get_user_model().objects.create_user(username, password="pw-for-tests", **fields)


def grant(user, *perms):
    """``user`` given these permissions ("fleet.drain_node"), fresh from the database.

    Fresh because Django caches a user's permissions on the object.
    """
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return get_user_model().objects.get(pk=user.pk)


def operator(username="ops", **fields):
    """A staff user with every fleet permission: whom tests of behaviour, not of access, act as."""
    user = staff_user(username, **fields)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="fleet"))
    return user


def manage_key(user=None, **fields):
    """A manage-scope API key (of an operator unless ``user`` says); returns (key, secret)."""
    return api_keys.create_api_key(
        "automation", scope=ApiKeyScope.MANAGE, user=user or operator(), **fields
    )


def bearer(secret) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


class _FormScraper(HTMLParser):
    """What a browser would submit for the page's main form."""

    def __init__(self):
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self._textarea = None
        self._select = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind in ("submit", "button", "file"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            # A checked box without a value posts "on"; an empty input posts "".
            default = "on" if kind in ("checkbox", "radio") else ""
            self.data.setdefault(name, []).append(a.get("value", default))
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = [""]
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.data.setdefault(self._select, []).append(a.get("value", ""))

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea][0] += data


def form_data(html: str) -> dict:
    """The fields a browser would post back for an admin form, as the test client takes them."""
    scraper = _FormScraper()
    scraper.feed(html)
    return {k: (v if len(v) > 1 else v[0]) for k, v in scraper.data.items()}
