"""Registrations written in batches across this process's sockets, and the fleet's
coming back after a restart.

Each socket's register is submitted to one ``NodeBatcher`` per event loop
(``registrations``), which writes what arrives together in one call
(``registration.register_many``), leaving out those whose agent has stopped
waiting. While the fleet comes back, each batch written moves the grace period
(``rejoin``, this process's ``expiry.Rejoin``). This changes with how
registrations are written together; what a registration writes is
``fleet.services.registration``'s.
"""

import time

from django.utils import timezone

from fleet.services import registration
from fleet.services.reconciler import expiry

from . import db as socket_db

# This process's view of its fleet coming back after it started: while the wave
# lasts, the grace period moves with it (expiry.Rejoin).
rejoin = expiry.Rejoin()


def register_batch(regs: list[registration.Registration]) -> dict:
    """A batch of registrations (``registration.register_many``), less those whose agent
    has stopped waiting (``socket_db.TooLate``: nothing of them written); each one
    written moves the grace period while the fleet is coming back."""
    # Taken before the write, so the batch's own rows count as registered since the
    # wave began when the first batch starts it.
    now = timezone.now()
    now_mono = time.monotonic()
    late = {
        r.node_id: socket_db.TooLate(f"registration of {r.node_id} waited")
        for r in regs
        if r.deadline is not None and now_mono > r.deadline
    }
    results = registration.register_many([r for r in regs if r.node_id not in late])
    if any(isinstance(r, registration.Registered) for r in results.values()):
        rejoin.registered(now)
    return results | late


def registrations() -> socket_db.NodeBatcher:
    """The current event loop's batcher of registrations."""
    return socket_db.node_batcher("registrations", register_batch, registration.MAX_BATCH)
