"""Routes of the management API: plural, kebab-case, each domain's viewsets on one router.

It only joins the domains (a package each under fleet/api/); what a route does is its
domain's. The order is the API root's (``GET /api/v1/``), which lists them as registered.
"""

from rest_framework.routers import DefaultRouter

from .access import views as access
from .adapters import views as adapters
from .audit import views as audit
from .catalog import views as catalog
from .costs import views as costs
from .nodes import views as nodes
from .teams import views as teams
from .weights import views as weights
from .workload import views as workload

router = DefaultRouter()
router.register("nodes", nodes.NodeViewSet)
router.register("gpus", nodes.GPUViewSet)
router.register("models", catalog.ModelViewSet)
router.register("engine-profiles", catalog.EngineProfileViewSet)
router.register("adapters", adapters.AdapterViewSet)
router.register("engines", nodes.WantedEngineViewSet)
router.register("replicas", workload.ReplicaViewSet)
router.register("shards", workload.ShardViewSet)
router.register("events", workload.EventViewSet)
router.register("catalog", catalog.CatalogViewSet, basename="catalog")
router.register("join-tokens", access.JoinTokenViewSet, basename="join-token")
router.register("api-keys", access.ApiKeyViewSet, basename="api-key")
router.register("usage", access.UsageViewSet, basename="usage")
router.register("weights", weights.WeightsViewSet)
router.register("audit", audit.AuditViewSet)
router.register("teams", teams.TeamViewSet)
router.register("prices", costs.PriceViewSet)
router.register("costs", costs.CostViewSet, basename="cost")

urlpatterns = router.urls
