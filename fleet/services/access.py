"""Join tokens, node credentials and who an agent is."""

import ipaddress
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fleet import audit
from fleet.conf import fleet_settings, networks
from fleet.models import JoinToken, Node, NodeCredential

from . import doorbells, permissions
from .permissions import SYSTEM

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentIdentity:
    """Who is on the other end of an agent socket, decided by its bearer secret."""

    credential_id: int | None = None
    node_id: str | None = None  # set for a node credential: the only node it may be
    join_token_id: int | None = None
    # The CN of the client certificate a trusted proxy verified (client_cert_node),
    # when LLMGW_CLIENT_CERT_PROXIES is set: the only node this socket may be, too.
    cert_node_id: str | None = None

    @property
    def enrolling(self) -> bool:
        return self.join_token_id is not None


class EnrolmentError(Exception):
    """An agent may not register as the node it named. The message says why."""


def mgmt_addr_refusal(addr: str, peer: str | None) -> str | None:
    """Why an agent may not say its node is at ``addr``, or None when it may.

    The gateway connects to a node's mgmt_addr and the control plane scrapes it,
    so a node could otherwise point them at any address the control plane can
    reach (its own loopback, a cloud metadata service). ``addr`` is an IP
    literal or "" (the schema says so); ``peer`` is the address the agent's
    socket came from. With ``agent_addr_networks`` set, the address must be in
    one of them (and anything in them is allowed). Without, any unicast
    address is, and loopback only for an agent whose socket comes from
    loopback: it runs on this machine, where the dev stack's and the tests'
    agents run, so its loopback is ours.
    """
    if not addr:
        return None  # no address: nothing connects to it
    ip = _address(addr)
    if ip.is_unspecified or ip.is_multicast:
        return f"mgmt_addr {addr} is not an address a node can be reached at"
    allowed = networks(fleet_settings().agent_addr_networks)
    if allowed:
        if any(ip in net for net in allowed):
            return None
        return f"mgmt_addr {addr} is outside the agent networks (LLMGW_AGENT_ADDR_NETWORKS)"
    if ip.is_loopback:
        if peer and _is_loopback(peer):
            return None
        return f"mgmt_addr {addr} is loopback, and this agent is not on the control plane's machine"
    if ip.is_link_local or ip.is_reserved:
        kind = "link-local" if ip.is_link_local else "reserved"
        return (
            f"mgmt_addr {addr} is a {kind} address; list its network in LLMGW_AGENT_ADDR_NETWORKS"
        )
    return None


# The header the TLS-terminating proxy sets to the verified client certificate's
# CN (HAProxy: %[ssl_c_s_dn(cn)]; docs/security.md). No underscore: Daphne drops
# headers whose names have one.
CLIENT_CERT_HEADER = "X-LLMGW-Client-CN"


def mismatch_refusal(named: str, claimed: str, by: str = "") -> str:
    """The refusal of a socket whose credential names another node than it registers as."""
    return f"this credential is for node '{named}', not '{claimed}'{by}"


@dataclass(frozen=True)
class CertCheck:
    """What a socket's client certificate says, as far as the control plane trusts it."""

    node_id: str | None = None  # the CN, from a trusted proxy: the node this socket must be
    refusal: str | None = None  # why the socket may not go on; None when it may


def client_cert_node(peer: str | None, values: list[str]) -> CertCheck:
    """Who a socket's client certificate says it is, from ``values`` of CLIENT_CERT_HEADER.

    ``peer`` is the address the socket's TCP connection came from (never one
    from X-Forwarded-For: a client can write that). With
    ``client_cert_proxies`` empty the feature is off: the header means nothing
    and is not read. Set, a certificate is required of every agent: the socket
    must come from one of those proxies, which verified the certificate
    against the site's CA and put its CN in exactly one header. A socket from
    anywhere else is refused, whatever headers it carries (logged, so a
    forgery or a bypassed proxy shows), since a certificate check a node can
    walk around checks nothing.
    """
    proxies = networks(fleet_settings().client_cert_proxies)
    if not proxies:
        return CertCheck()
    try:
        ip = _address(peer or "")
    except ValueError:
        ip = None  # a unix socket, or no address: not a proxy we know
    if ip is None or not any(ip in net for net in proxies):
        if values:
            logger.warning(
                "%s header from %s ignored: not a proxy in LLMGW_CLIENT_CERT_PROXIES",
                CLIENT_CERT_HEADER,
                peer or "an unknown address",
            )
        return CertCheck(
            refusal=f"this control plane identifies nodes by client certificate: "
            f"connect through the TLS proxy that checks it, not from {peer or 'an unknown address'}"
        )
    cns = [v.strip() for v in values]
    if len(cns) != 1 or not cns[0]:
        return CertCheck(
            refusal=f"the proxy at {peer} passed no client certificate subject "
            f"({CLIENT_CERT_HEADER}); a certificate whose CN is the node id is required"
        )
    return CertCheck(node_id=cns[0])


def _is_loopback(host: str) -> bool:
    try:
        ip = _address(host)
    except ValueError:
        return False  # a unix socket or a name: not known to be this machine
    return ip.is_loopback


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address ``text`` names, ::ffff:127.0.0.1 read as the 127.0.0.1 it is."""
    ip = ipaddress.ip_address(text)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return ip.ipv4_mapped
    return ip


def create_join_token(name: str, *, ttl: timedelta, max_uses: int = 1, user=None, actor=SYSTEM):
    """A new join token; returns (token, secret). The secret is shown once.

    ``actor`` needs add_jointoken (permissions.Refused otherwise); the token records
    ``user``, else the actor's user, as who created it.
    """
    permissions.require_action(actor, "join_token.create", "create a join token")
    user = user if user is not None else permissions.user_of(actor)
    if max_uses < 1:
        raise ValueError(f"max_uses must be at least 1 (got {max_uses})")
    if ttl.total_seconds() <= 0:
        raise ValueError("a join token's lifetime must be positive")
    token, secret = JoinToken.issue(
        name=name, expires_at=timezone.now() + ttl, max_uses=max_uses, created_by=user
    )
    logger.info("join token created name=%s prefix=%s max_uses=%d", name, token.prefix, max_uses)
    return token, secret


# A credential's last use is written at most this often: a fleet reconnecting at
# once after a restart would otherwise spend a write per node on a date operators
# read to the minute.
LAST_USED_EVERY = timedelta(minutes=1)


def identify(bearer: str) -> AgentIdentity | None:
    """The identity a bearer secret proves, or None. Revoked, expired and used-up are None.

    Reads only: a node credential's last use is written when its registration is
    (``note_used``, a batch at a time), not on the handshake, where a whole
    fleet coming back spent a write and a commit per agent on it.
    """
    if not bearer:
        return None
    cred = NodeCredential.find(bearer, NodeCredential.objects.filter(revoked_at__isnull=True))
    if cred is not None:
        return AgentIdentity(credential_id=cred.pk, node_id=cred.node_id)
    token = JoinToken.find(bearer)
    if token is not None and token.usable() is None:
        return AgentIdentity(join_token_id=token.pk)
    return None


def note_used(credential_ids, now: datetime | None = None) -> int:
    """These node credentials were used now (their agents registered): one UPDATE for
    those whose last use is older than ``LAST_USED_EVERY``. Returns how many changed."""
    ids = list(credential_ids)
    if not ids:
        return 0
    now = now or timezone.now()
    return (
        NodeCredential.objects.filter(pk__in=ids)
        .filter(Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_EVERY))
        .update(last_used_at=now)
    )


def credential_revoked(credential_id: int) -> bool:
    return not NodeCredential.objects.filter(pk=credential_id, revoked_at__isnull=True).exists()


class Revoked(Exception):
    """A socket's credential no longer holds (revoked, or its node removed): nothing it
    sends is written."""


def as_node(credential_id: int, node_id: str, write, *args, **kwargs):
    """Run ``write(*args, **kwargs)`` for an agent's socket, only while its credential holds.

    The rule for every write an agent's message makes: the credential is live and
    names this node (a removed node's credentials went with it). Checked in the
    write's own transaction with the credential's row locked, so once
    ``revoke_node`` has returned no later write of that credential lands; a
    revocation whose doorbell was lost still writes nothing. Raises Revoked,
    having written nothing, when it does not hold. The heartbeat writers apply
    the same rule inside their batch queries (fleet.services.heartbeat).
    """
    with transaction.atomic():
        held = (
            NodeCredential.objects.select_for_update()
            .filter(pk=credential_id, node_id=node_id, revoked_at__isnull=True)
            .values_list("pk", flat=True)
            .first()
        )
        if held is None:
            raise Revoked(f"credential of node '{node_id}' revoked or node removed")
        return write(*args, **kwargs)


def check_node(identity: AgentIdentity, node_id: str) -> None:
    """Raise EnrolmentError unless this identity may be ``node_id``, as far as it says by
    itself (no database): its client certificate's CN, and a node credential's node."""
    if identity.cert_node_id is not None and identity.cert_node_id != node_id:
        # Checked first, so a join token is not used up by a node that cannot be it.
        raise EnrolmentError(
            mismatch_refusal(identity.cert_node_id, node_id, " (its client certificate's CN)")
        )
    if not identity.enrolling and identity.node_id != node_id:
        raise EnrolmentError(mismatch_refusal(identity.node_id, node_id))


def enrol(identity: AgentIdentity, node_id: str) -> tuple[AgentIdentity, str | None]:
    """Check that this identity may register as ``node_id``; enrol it if it holds a join token.

    Returns the identity to use from now on and, on enrolment, the node's new
    credential (shown to the agent once). Raises EnrolmentError and changes
    nothing when it may not: a node credential for another node, or a client
    certificate (``cert_node_id``) for another node, refused the same way.
    """
    check_node(identity, node_id)
    if not identity.enrolling:
        return identity, None
    # The agent's own act, with the join token an operator gave it.
    scope = audit.acting("agent", node=node_id, join_token=identity.join_token_id)
    with transaction.atomic(), scope:
        # The conditional update is the guard: two agents racing for the last
        # use of a token cannot both win it.
        now = timezone.now()
        used = JoinToken.objects.filter(
            pk=identity.join_token_id,
            revoked_at__isnull=True,
            expires_at__gt=now,
            uses__lt=F("max_uses"),
        ).update(uses=F("uses") + 1)
        if not used:
            token = JoinToken.objects.filter(pk=identity.join_token_id).first()
            raise EnrolmentError(token.usable(now) if token else "join token deleted")
        node, created = Node.objects.get_or_create(pk=node_id)
        if not created and node.credentials.filter(revoked_at__isnull=True).exists():
            # A join token enrols a new node. Letting it take over an enrolled one
            # would let anyone holding a token impersonate any node in the fleet.
            raise EnrolmentError(
                f"node '{node_id}' is already enrolled; connect with its own credential"
            )
        cred, secret = NodeCredential.issue(node=node, join_token_id=identity.join_token_id)
    logger.info("node enrolled node=%s join_token=%s", node_id, identity.join_token_id)
    return AgentIdentity(credential_id=cred.pk, node_id=node_id), secret


def revoke_node(node: Node, actor=SYSTEM) -> int:
    """Revoke every credential of a node and close its socket. Returns how many were revoked.

    ``actor`` needs change_node (permissions.Refused otherwise)."""
    permissions.require_action(actor, "node.revoke", f"revoke node '{node.pk}'")
    with transaction.atomic():
        live = list(NodeCredential.objects.filter(node=node, revoked_at__isnull=True))
        now = timezone.now()
        count = NodeCredential.objects.filter(pk__in=[c.pk for c in live]).update(revoked_at=now)
        for cred in live:
            audit.record(cred, {"revoked_at": (None, now)})
        doorbells.ring_node(node.pk, doorbells.NODE_REVOKED)
    logger.warning("node credentials revoked node=%s count=%d", node.pk, count)
    return count


def revoke_join_token(token: JoinToken, actor=SYSTEM) -> bool:
    """Revoke a join token (change_jointoken); returns whether it was usable before."""
    permissions.require_action(actor, "join_token.revoke", "revoke a join token")
    now = timezone.now()
    changed = bool(
        JoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    )
    if changed:
        audit.record(token, {"revoked_at": (None, now)})
    return changed
