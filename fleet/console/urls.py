"""The console's URLs, mounted at /admin/cluster/ (llmgw_site/urls.py)."""

from django.urls import path

from . import gpus, node_actions, views

app_name = "console"

urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("fragment/", views.cluster_fragment, name="cluster-fragment"),
    path("nodes/<str:node_id>/", views.node, name="node"),
    path("nodes/<str:node_id>/fragment/", views.node_fragment, name="node-fragment"),
    path("nodes/<str:node_id>/charts/", views.node_charts, name="node-charts"),
    path("nodes/<str:node_id>/logs/", views.node_logs_view, name="node-logs"),
    path("nodes/<str:node_id>/<str:action>/", node_actions.node_action, name="node-action"),
    path("nodes/<str:node_id>/gpus/<int:index>/clear/", gpus.gpu_clear, name="gpu-clear"),
    path("models/<int:pk>/", views.model, name="model"),
    path("models/<int:pk>/fragment/", views.model_fragment, name="model-fragment"),
    path("costs/", views.costs, name="costs"),
    path("batches/", views.batches, name="batches"),
    path("batches/fragment/", views.batches_fragment, name="batches-fragment"),
    path("batches/<str:batch_id>/", views.batch, name="batch"),
    path("batches/<str:batch_id>/fragment/", views.batch_fragment, name="batch-fragment"),
    path(
        "models/<int:pk>/replicas/<str:replica_id>/<str:action>/",
        views.replica_action,
        name="replica-action",
    ),
]
