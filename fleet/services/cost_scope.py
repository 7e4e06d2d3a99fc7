"""Whose costs an operator sees: the one rule the cost page, the API and ``llmgw costs`` ask.

On top of the permission to read costs (``fleet.view_costhour``):

- with ``fleet.manage_all_teams`` (superusers have it), every team's, the fleet's
  models' and the idle no replica held: the whole bill;
- a member of teams, those teams' costs only. Another team's spending is its own
  business, as its batches are (``services.batches.owners.seen_by``), and the
  fleet's idle is not any team's;
- someone in no team, what belongs to no team: the fleet's models and the idle,
  as they change only what belongs to no team (``services.teams.scope_filter``).

What is left out is left out of the totals too, so a total never tells a member
what the others spent.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from .permissions import manages_all, teams_of

COSTS = "fleet.view_costhour"


@dataclass(frozen=True)
class Seen:
    """What a user sees: ``within`` narrows CostHour rows (None: all of them)."""

    within: Q | None
    teams: tuple[str, ...]  # the teams shown, by name; () with every team
    idle: bool  # whether the fleet's idle is shown
    everything: bool

    def describe(self) -> str:
        if self.everything:
            return "every team, the fleet's models and the idle"
        if self.teams:
            shown = ", ".join(f"'{t}'" for t in self.teams)
            return f"team{'s' if len(self.teams) > 1 else ''} {shown} only"
        return "the fleet's models (of no team) and the idle"


def seen_by(user) -> Seen:
    if manages_all(user):
        return Seen(None, (), True, True)
    mine = teams_of(user)
    if mine:
        # By the team, not its name: a renamed team keeps its history.
        return Seen(Q(idle=False, team_id__in=list(mine)), tuple(mine.values()), False, False)
    # A deleted team's rows keep its name (and lose the link): still not the fleet's.
    return Seen(Q(team__isnull=True, team_name=""), (), True, False)
