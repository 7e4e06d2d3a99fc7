from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            audit,
            signals,  # noqa: F401 - connects the reconciler's receivers
        )
        from .services import (
            fleet_metrics,
            teams,  # noqa: F401 - registers teams' object permissions (django-rules)
        )
        from .services.autoscaler import metrics as autoscaler_metrics
        from .services.reconciler import metrics as reconciler_metrics
        from .services.weights_gc import metrics as weights_metrics

        audit.register()
        reconciler_metrics.register()
        autoscaler_metrics.register()
        fleet_metrics.register()
        weights_metrics.register()
