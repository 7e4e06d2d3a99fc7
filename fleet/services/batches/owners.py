"""Who sees which batch files and batches, and the pages of a list.

A file or batch belongs to the team of the key that made it, so every key of
that team may use it; one made by a key of no team belongs to that key alone.
Anything else is answered as if it did not exist (404), so a key learns
nothing of another team's files, not even that they exist.
"""

from django.db.models import Q


def owned(queryset, key):
    """``queryset`` (of BatchFile or Batch) narrowed to what ``key`` (an ApiKey) may see."""
    if key.team_id is not None:
        return queryset.filter(team_id=key.team_id)
    return queryset.filter(api_key_id=key.pk, team__isnull=True)


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
