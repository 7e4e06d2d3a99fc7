"""Changes that matter to the reconciler ask for a pass as soon as they commit.

Catalog edits (admin, API, ``apply``) and node registrations arrive here;
shard status and heartbeats are updates without signals, so inventory asks
for a pass itself when a shard fails, gets ready or stops, or a node returns.
"""

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from fleet.models import Adapter, EngineProfile, Model, Node, Team, WantedEngine
from fleet.services.reconciler.ask import request_reconcile


@receiver(post_save, sender=Model)
@receiver(post_delete, sender=Model)
@receiver(post_save, sender=EngineProfile)
@receiver(post_save, sender=Node)
@receiver(post_delete, sender=Node)
def _catalog_or_node_changed(sender, **kwargs) -> None:
    request_reconcile()


@receiver(post_save, sender=WantedEngine)
@receiver(post_delete, sender=WantedEngine)
def _wanted_engines_changed(sender, **kwargs) -> None:
    """Every connected node hears at once: the admin, the API and ``apply`` all save rows."""
    from fleet.services.engines import tell_nodes

    tell_nodes()


@receiver(post_save, sender=Team)
@receiver(post_delete, sender=Team)
def _team_changed(sender, **kwargs) -> None:
    """A quota moved: placement looks again, and the gateways reload their keys (each
    carries its team's token budget)."""
    from fleet.services import doorbells

    request_reconcile()
    doorbells.ring_gateways("keys")


@receiver(post_save, sender=Adapter)
@receiver(post_delete, sender=Adapter)
def _adapter_changed(sender, instance, **kwargs) -> None:
    """The replicas of its base model load or unload it (their nodes get a new desired
    set), and the gateways list and route it."""
    from fleet.services import adapters, doorbells
    from fleet.services.desired import bump_desired

    bump_desired(adapters.nodes_of([instance.model_id]))
    doorbells.ring_gateways("routes")
