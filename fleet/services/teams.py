"""Teams: whose models and API keys an actor may change, and what each team holds now.

**Scope.** A team's members (the users of its group) change that team's
models, profiles, replicas and API keys, and see everyone else's read-only;
someone in no team changes only what belongs to no team; the permission
``fleet.manage_all_teams`` (superusers have every permission) changes all of
them. Scope comes on top of the Django permission an action needs, never
instead of it: a member without ``change_model`` changes nothing.

It is one rule (``permissions.scope_problem``, ``problem`` here) asked from
every door. The admin and the API ask it as Django object permissions
(``user.has_perm("fleet.change_model", model)``), which django-rules answers
from the predicates registered below, so the admin's read-only pages and
DRF's object checks need no code of their own; the services
(``permissions.require_action(..., on=obj)``), catalog files and management
commands ask it directly.

**Quotas.** ``Holdings`` is what each team's placed replicas hold now (GPUs,
GPU memory, replicas); placement refuses a replica that would take its team
past a quota, with the reason, and the cluster page shows the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import rules

from fleet.models import (
    SHARD_FINISHED,
    Adapter,
    EngineProfile,
    Model,
    Replica,
    ReplicaState,
    Shard,
    Team,
)
from fleet.models.access import ApiKey

from .permissions import (
    MANAGE_ALL_TEAMS,
    SYSTEM,
    Refused,
    manages_all,
    name_of,
    scope_problem,
    team_names,
    team_of,
    teams_of,
)
from .units import MIB_PER_GIB, share_mb

# The rule itself is permissions.py's (require_action(..., on=obj) asks it); these
# are its names for the doors that ask about teams.
MANAGE_ALL = MANAGE_ALL_TEAMS
problem = scope_problem


def owned(obj) -> bool:
    """Whether ``obj`` is of a kind teams own: a model, profile, replica, adapter or API key."""
    return isinstance(obj, Model | ApiKey | EngineProfile | Replica | Adapter)


def team_for_new(actor, team: Team | None, what: str) -> Team | None:
    """The team a new model or key of ``actor`` belongs to: the one named, else the
    actor's own when they are in exactly one. Raises Refused for a team they may not
    give things to, or when they are in several and named none."""
    if team is None and actor is not SYSTEM and not manages_all(actor):
        mine = teams_of(actor)
        if len(mine) == 1:
            team = Team.objects.get(pk=next(iter(mine)))
        elif len(mine) > 1:
            raise Refused(
                f"{name_of(actor)} is in teams {team_names(mine)}: name the team of {what}"
            )
    if why := problem(actor, team.pk if team else None, f"give {what} to {_team_text(team)}"):
        raise Refused(why)
    return team


def assignable(actor):
    """The teams ``actor`` may give a model or key to."""
    if manages_all(actor):
        return Team.objects.all()
    return Team.objects.filter(pk__in=teams_of(actor))


def scope_filter(queryset, actor, field: str = "team"):
    """``queryset`` narrowed to the objects in ``actor``'s scope (``field``: the path to
    their team, e.g. "model__team")."""
    if manages_all(actor):
        return queryset
    mine = teams_of(actor)
    if mine:
        return queryset.filter(**{f"{field}__in": list(mine)})
    return queryset.filter(**{f"{field}__isnull": True})


def _team_text(team: Team | None) -> str:
    return f"team '{team.name}'" if team else "no team"


# ---- object permissions (django-rules) --------------------------------------------
#
# Each is the Django permission itself AND the team's scope. Asked without an
# object they answer False, leaving the answer to Django's ModelBackend (the
# user's model permissions), so a rule here can only ever narrow what a user has.

SCOPED = (
    "fleet.change_model",
    "fleet.delete_model",
    "fleet.change_engineprofile",
    "fleet.delete_engineprofile",
    "fleet.change_adapter",
    "fleet.delete_adapter",
    "fleet.set_engine_args_env",
    "fleet.change_apikey",
    "fleet.delete_apikey",
    "fleet.drain_replica",
)


def _scoped(perm: str):
    @rules.predicate(name=f"{perm} within the team")
    def check(user, obj) -> bool:
        if obj is None:
            return False
        return user.has_perm(perm) and problem(user, team_of(obj), "") is None

    return check


for _perm in SCOPED:
    rules.add_perm(_perm, _scoped(_perm))


# ---- what teams hold now -----------------------------------------------------------


@dataclass
class Held:
    gpus: set = field(default_factory=set)  # (node, GPU uuid)
    memory_mb: int = 0  # MiB, as NVML counts GPU memory
    replicas: set = field(default_factory=set)  # replica ids
    draining_mb: int = 0  # of memory_mb, what draining replicas hold until they stop


@dataclass
class Holdings:
    """What each team's placed replicas hold now, and the quotas they are held to."""

    teams: dict[int, Team]
    held: dict[int, Held]
    gpu_mb: dict[tuple[str, str], int]  # (node, uuid) -> the GPU's memory, as looked up
    snap: object = None  # placement's Snapshot, where there is one

    @classmethod
    def now(cls, snap=None, teams: list[Team] | None = None) -> Holdings:
        """As the database has it; ``snap`` (placement's snapshot), where given, knows
        every GPU's memory already; ``teams``, where given, are every team."""
        from fleet.models import GPU

        teams = {t.pk: t for t in (Team.objects.all() if teams is None else teams)}
        held: dict[int, Held] = {pk: Held() for pk in teams}
        found = cls(teams, held, {}, snap)
        if not teams:
            return found
        rows = list(
            Shard.objects.filter(
                replica__model__team__isnull=False,
                node__isnull=False,
                replica__state__in=[
                    ReplicaState.STARTING,
                    ReplicaState.READY,
                    ReplicaState.DRAINING,
                ],
            )
            .exclude(state__in=SHARD_FINISHED)
            .values_list(
                "replica__model__team_id",
                "replica_id",
                "node_id",
                "gpu_uuids",
                "replica__profile__gpu_memory_gb",
                "replica__state",
            )
        )
        if snap is None:
            uuids = {u for *_, us, _, _ in rows for u in us or ()}
            rows_mb = GPU.objects.filter(uuid__in=uuids).values_list(
                "node_id", "uuid", "memory_total_mb"
            )
            found.gpu_mb.update(((n, u), mb) for n, u, mb in rows_mb)
        for team_id, replica_id, node_id, uuids, share_gb, state in rows:
            h = held[team_id]
            h.replicas.add(replica_id)
            share = share_mb(share_gb)
            for uuid in uuids or ():
                h.gpus.add((node_id, uuid))
                mb = share or found.memory_of((node_id, uuid))
                h.memory_mb += mb
                if state == ReplicaState.DRAINING:
                    h.draining_mb += mb
        return found

    def memory_of(self, gpu: tuple[str, str]) -> int:
        """A GPU's memory in MiB, by (node, uuid)."""
        if gpu in self.gpu_mb:
            return self.gpu_mb[gpu]
        if self.snap is not None and (node := self.snap.nodes.get(gpu[0])) is not None:
            for g in node.gpus:
                if g.uuid == gpu[1]:
                    self.gpu_mb[gpu] = g.memory_mb
                    return g.memory_mb
        return 0

    def refusal(self, team_id: int | None, req, placement=None) -> str | None:
        """Why one more replica of team ``team_id`` would take it past a quota, else None.

        ``req`` is placement's request; with ``placement`` (where it would go), the
        GPUs and memory are exact, else counted from the request (a whole GPU's memory
        unknown until placed: its lower bound, the memory it must have).
        """
        team = self.teams.get(team_id)
        if team is None:
            return None
        h = self.held[team_id]
        if team.max_replicas is not None and len(h.replicas) >= team.max_replicas:
            return f"team {team.name}: {len(h.replicas)} of {team.max_replicas} replicas in use"
        if placement is not None:
            new = [(s.node_id, u) for s in placement.shards for u in s.gpu_uuids]
            gpus = len(set(new) - h.gpus)
            mb = sum(req.gpu_memory_mb or self.memory_of(g) for g in new)
        else:
            gpus = req.gpus_per_node * req.nodes
            mb = gpus * (req.gpu_memory_mb or req.min_gpu_mb)
        if team.max_gpus is not None and gpus and len(h.gpus) + gpus > team.max_gpus:
            more = f", needs {gpus} more" if gpus > 1 else ""
            return f"team {team.name}: {len(h.gpus)} of {team.max_gpus} GPUs in use{more}"
        quota = team.max_gpu_memory_gb
        if quota is not None and mb and h.memory_mb + mb > quota * MIB_PER_GIB:
            return (
                f"team {team.name}: {gib_text(h.memory_mb)} of {quota} GB of GPU memory in use, "
                f"needs {gib_text(mb)} more"
            )
        return None

    def add(self, team_id: int | None, replica_id: str, req, placement) -> None:
        h = self.held.get(team_id)
        if h is None:
            return
        h.replicas.add(replica_id)
        for s in placement.shards:
            for u in s.gpu_uuids:
                h.gpus.add((s.node_id, u))
                h.memory_mb += req.gpu_memory_mb or self.memory_of((s.node_id, u))


def gib_text(mib: int) -> str:
    """GPU memory in GB as engines count it (GiB), whole when exact, else to a tenth."""
    whole, rest = divmod(mib, MIB_PER_GIB)
    return str(whole) if not rest else f"{mib / MIB_PER_GIB:.1f}"


NOTHING_IN_USE = {"gpus": 0, "gpu_memory_gb": 0.0, "replicas": 0, "tokens_this_month": 0}


def in_use(teams: list[Team] | None = None, now=None) -> dict[int, dict]:
    """By team id: GPUs, GPU memory (GB) and replicas its models hold now, and the tokens
    its keys used this UTC month (from the gateways' usage rows). Three queries, given
    ``teams`` (every team), whatever the fleet's size."""
    from django.db.models import Sum
    from django.utils import timezone

    from fleet.models import KeyUsage

    holdings = Holdings.now(teams=teams)
    now = now or timezone.now()
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    tokens = dict(
        KeyUsage.objects.filter(key__team__isnull=False, hour__gte=month)
        .values("key__team")
        .annotate(n=Sum("prompt_tokens") + Sum("completion_tokens"))
        .values_list("key__team", "n")
    )
    return {
        pk: {
            "gpus": len(h.gpus),
            "gpu_memory_gb": round(h.memory_mb / MIB_PER_GIB, 1),
            "replicas": len(h.replicas),
            "tokens_this_month": tokens.get(pk) or 0,
        }
        for pk, h in holdings.held.items()
    }
