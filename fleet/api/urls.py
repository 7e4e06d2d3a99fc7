"""Routes of the management API: plural, kebab-case."""

from rest_framework.routers import DefaultRouter

from . import costs, views

router = DefaultRouter()
router.register("nodes", views.NodeViewSet)
router.register("gpus", views.GPUViewSet)
router.register("models", views.ModelViewSet)
router.register("engine-profiles", views.EngineProfileViewSet)
router.register("adapters", views.AdapterViewSet)
router.register("engines", views.WantedEngineViewSet)
router.register("replicas", views.ReplicaViewSet)
router.register("shards", views.ShardViewSet)
router.register("events", views.EventViewSet)
router.register("catalog", views.CatalogViewSet, basename="catalog")
router.register("join-tokens", views.JoinTokenViewSet, basename="join-token")
router.register("api-keys", views.ApiKeyViewSet, basename="api-key")
router.register("usage", views.UsageViewSet, basename="usage")
router.register("weights", views.WeightsViewSet)
router.register("audit", views.AuditViewSet)
router.register("teams", views.TeamViewSet)
router.register("prices", costs.PriceViewSet)
router.register("costs", costs.CostViewSet, basename="cost")

urlpatterns = router.urls
