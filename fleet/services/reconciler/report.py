"""What one reconciler pass did: counts for its log line, the benchmark and the tests."""

from dataclasses import dataclass, field


@dataclass
class PassReport:
    """What one pass did, for logs, the benchmark and tests."""

    placed: int = 0
    unplaceable: int = 0
    restarts: int = 0
    timed_out: int = 0
    replaced: int = 0
    created: int = 0
    retired: int = 0
    stopped: int = 0
    adopted: int = 0
    unclaimed: int = 0
    drains_finished: int = 0
    deleted: int = 0
    scaled: int = 0  # autoscaler decisions
    preempted: int = 0  # replicas drained to make room for a higher priority
    slept: int = 0  # replicas put to sleep (idle, or to make way on their GPUs)
    woken: int = 0  # replicas woken for requests waiting
    paused: bool = False
    nodes_notified: list[str] = field(default_factory=list)
    duration_ms: float = 0.0
    # Milliseconds per phase, for the benchmark and for a slow pass's log line.
    phases: dict[str, float] = field(default_factory=dict)

    def changed(self) -> bool:
        return any(
            (
                self.placed,
                self.unplaceable,
                self.restarts,
                self.timed_out,
                self.replaced,
                self.created,
                self.retired,
                self.stopped,
                self.unclaimed,
                self.drains_finished,
                self.scaled,
                self.preempted,
                self.slept,
                self.woken,
            )
        )

    def summary(self) -> str:
        fields = (
            "created",
            "placed",
            "unplaceable",
            "restarts",
            "timed_out",
            "replaced",
            "retired",
            "scaled",
            "preempted",
            "slept",
            "woken",
        )
        parts = [f"{f}={getattr(self, f)}" for f in fields if getattr(self, f)]
        parts += [f"nodes_notified={len(self.nodes_notified)}", f"ms={self.duration_ms:.1f}"]
        return " ".join(parts)
