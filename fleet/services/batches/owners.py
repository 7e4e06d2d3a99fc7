"""Who sees which batch files and batches, and the pages of a list.

A file or batch belongs to the team of the key that made it, so every key of
that team may use it; one made by a key of no team belongs to that key alone.
Anything else is answered as if it did not exist (404), so a key learns
nothing of another team's files, not even that they exist.

Operators (the console, the admin) see by the same ownership: those with
``fleet.manage_all_teams`` every batch, anyone else their teams' and those of
their own keys of no team (``seen_by``).
"""

from django.db.models import Q

from ..permissions import manages_all, teams_of


def owned(queryset, key):
    """``queryset`` (of BatchFile or Batch) narrowed to what ``key`` (an ApiKey) may see."""
    if key.team_id is not None:
        return queryset.filter(team_id=key.team_id)
    return queryset.filter(api_key_id=key.pk, team__isnull=True)


def seen_by(queryset, user, prefix: str = ""):
    """``queryset`` (of BatchFile or Batch; ``prefix`` "batch__" for BatchLine) narrowed to
    what an operator may see: everything with ``fleet.manage_all_teams``, else what the
    teams they are members of own and what their own keys of no team made.

    Unlike models, which a member sees across teams read-only, a batch holds a team's
    prompts and answers: another team's are not shown at all.
    """
    if not getattr(user, "is_authenticated", False):
        return queryset.none()
    if manages_all(user):
        return queryset
    return queryset.filter(
        Q(**{f"{prefix}team_id__in": list(teams_of(user))})
        | Q(**{f"{prefix}team__isnull": True, f"{prefix}api_key__user_id": user.pk})
    )


def page(queryset, *, after: str | None, limit: int, newest_first: bool = True):
    """One page in creation order and whether more follow: the items after the one whose
    id is ``after`` (OpenAI's cursor). An ``after`` this queryset does not hold (deleted,
    or another team's) ends the list: an empty page, nothing more."""
    order = ["-created_at", "-id"] if newest_first else ["created_at", "id"]
    queryset = queryset.order_by(*order)
    if after:
        mark = queryset.filter(pk=after).values_list("created_at", flat=True).first()
        if mark is None:
            return [], False
        if newest_first:
            queryset = queryset.filter(Q(created_at__lt=mark) | Q(created_at=mark, id__lt=after))
        else:
            queryset = queryset.filter(Q(created_at__gt=mark) | Q(created_at=mark, id__gt=after))
    items = list(queryset[: limit + 1])
    return items[:limit], len(items) > limit
