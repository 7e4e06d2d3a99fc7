"""Teams: who is in each, and what each holds against its quotas. Changes when the
teams' listing does."""

from __future__ import annotations

from agentd.ctl.client import Api
from agentd.ctl.output import Output
from agentd.ctl.verb import Verb


def _teams(api: Api, args, show: Output) -> None:
    def of(used, quota) -> str:
        return f"{used} of {quota}" if quota is not None else f"{used}"

    def row(t) -> list[str]:
        use = t.get("in_use") or {}
        return [
            t["name"],
            ",".join(t.get("members") or []) or "-",
            of(use.get("gpus", 0), t.get("max_gpus")),
            of(use.get("gpu_memory_gb", 0), t.get("max_gpu_memory_gb")),
            of(use.get("replicas", 0), t.get("max_replicas")),
            of(use.get("tokens_this_month", 0), t.get("tokens_per_month")),
            str(t.get("max_priority", 0)),
            "-"
            if t.get("guaranteed_gpu_memory_gb") is None
            else str(t["guaranteed_gpu_memory_gb"]),
        ]

    header = [
        "TEAM",
        "MEMBERS",
        "GPUS",
        "GPU MEMORY (GB)",
        "REPLICAS",
        "TOKENS THIS MONTH",
        "MAX PRIORITY",
        "GUARANTEED (GB)",
    ]
    empty = "no teams: every model and key is the fleet's"
    show.listing(api.all_pages("teams/"), empty, header, row)


VERBS = {
    "teams": Verb("Teams: members, and what they hold against their quotas.", _teams),
}
