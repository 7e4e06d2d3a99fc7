"""The Batch API's routes, under /v1/ (llmgw_site/urls.py); OpenAI's paths, no trailing slash."""

from django.urls import path, re_path

from . import views

urlpatterns = [
    path("files", views.files_view),
    path("files/<str:file_id>", views.file_view),
    path("files/<str:file_id>/content", views.file_content_view),
    path("batches", views.batches_view),
    path("batches/<str:batch_id>", views.batch_view),
    path("batches/<str:batch_id>/cancel", views.batch_cancel_view),
    re_path(r"^(?P<rest>(?:files|batches)(?:/.*)?)$", views.unknown_view),
]
