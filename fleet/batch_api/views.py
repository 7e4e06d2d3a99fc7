"""The Batch API's endpoints, in OpenAI's shapes: validate, call a service, answer.

Every answer is JSON (a file's content excepted); every refusal is OpenAI's
``{"error": {"message", "type", "param", "code"}}``, which the official SDKs
raise as their errors. A file or batch of another team is a 404, as one that
does not exist.
"""

import functools
import json
import logging

from django.http import FileResponse, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.views.decorators.csrf import csrf_exempt

from fleet.conf import fleet_settings
from fleet.gateway import validate
from fleet.gateway.errors import GatewayError, error_body
from fleet.gateway.limits import Limits
from fleet.models import Batch, BatchFile, FilePurpose
from fleet.services.batches import files, jsonl, lifecycle, owners

from .auth import Refused, key_of

logger = logging.getLogger(__name__)


def _error(status: int, message: str, code=None, param=None) -> HttpResponse:
    return HttpResponse(
        error_body(status, message, code=code, param=param),
        status=status,
        content_type="application/json",
    )


def openai_view(*methods: str):
    """The method checked, the key found, and every refusal in OpenAI's shape."""

    def wrap(view):
        @csrf_exempt  # a bearer key, never a browser's cookie
        @functools.wraps(view)
        def inner(request, *args, **kwargs):
            if request.method not in methods:
                return _error(
                    405, f"{request.path} takes {' or '.join(methods)}, not {request.method}"
                )
            try:
                key = key_of(request)
                return view(request, key, *args, **kwargs)
            except Refused as exc:
                return _error(exc.status, exc.message, exc.code, exc.param)
            except lifecycle.BatchRefused as exc:
                return _error(exc.status, str(exc), param=exc.param)

        return inner

    return wrap


def _limit(request, default: int, most: int) -> int:
    text = request.GET.get("limit")
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise Refused(400, f"'limit' must be an integer, not {text!r}", param="limit") from None
    if not 1 <= value <= most:
        raise Refused(400, f"'limit' must be from 1 to {most}, not {value}", param="limit")
    return value


def _listing(items, has_more: bool, show) -> JsonResponse:
    data = [show(i) for i in items]
    return JsonResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


# ---- files ----------------------------------------------------------------------------


@openai_view("GET", "POST")
def files_view(request, key):
    if request.method == "POST":
        return _upload(request, key)
    queryset = owners.owned(BatchFile.objects, key)
    purpose = request.GET.get("purpose")
    if purpose:
        queryset = queryset.filter(purpose=purpose)
    order = request.GET.get("order", "desc")
    if order not in ("asc", "desc"):
        raise Refused(400, f"'order' must be asc or desc, not {order!r}", param="order")
    items, more = owners.page(
        queryset,
        after=request.GET.get("after"),
        limit=_limit(request, 10_000, 10_000),
        newest_first=order == "desc",
    )
    return _listing(items, more, lifecycle.file_as_openai)


def _gateway_rule(endpoint: str, raw: bytes) -> None:
    """The gateway's own check of a request body, for each line of an upload."""
    try:
        validate.parse(endpoint, raw)
    except GatewayError as exc:
        raise jsonl.BodyError(exc.message, exc.param) from None


def _upload(request, key):
    try:
        upload = request.FILES.get("file")
        purpose = request.POST.get("purpose")
        extra = sorted(k for k in request.POST if k != "purpose")
    except MultiPartParserError as exc:
        raise Refused(400, f"the upload is not a readable multipart form: {exc}") from None
    if upload is None:
        raise Refused(400, "send the file as the multipart field 'file'", param="file")
    if purpose != FilePurpose.BATCH:
        raise Refused(
            400,
            f"'purpose' must be 'batch' (the only files llmgw keeps), not {purpose!r}",
            param="purpose",
        )
    if extra:
        raise Refused(
            400,
            f"llmgw does not take {', '.join(extra)} with a file: its batch files are kept "
            "until deleted",
            param=extra[0],
        )
    c = fleet_settings()
    if upload.size > c.batch_file_max_bytes:
        raise Refused(
            413,
            f"the file is {upload.size} bytes; the limit is {c.batch_file_max_bytes}",
            "request_too_large",
            "file",
        )
    try:
        checked = jsonl.check(
            upload,
            max_lines=c.batch_max_lines,
            max_body_bytes=Limits.from_settings().max_body_bytes,
            check_body=_gateway_rule,
        )
    except jsonl.LineError as exc:
        raise Refused(400, f"{upload.name}: {exc}", "invalid_batch_line", exc.param) from None
    row = files.store_input(key, upload, upload.name or "batch.jsonl", checked)
    return JsonResponse(lifecycle.file_as_openai(row))


def _own_file(key, file_id: str) -> BatchFile:
    row = owners.owned(BatchFile.objects, key).filter(pk=file_id).first()
    if row is None:
        raise Refused(404, f"file {file_id} does not exist", "file_not_found", "file_id")
    return row


@openai_view("GET", "DELETE")
def file_view(request, key, file_id):
    row = _own_file(key, file_id)
    if request.method == "GET":
        return JsonResponse(lifecycle.file_as_openai(row))
    try:
        files.delete_file(row)
    except files.FileInUse as exc:
        raise Refused(409, str(exc), "file_in_use", "file_id") from None
    return JsonResponse({"id": file_id, "object": "file", "deleted": True})


@openai_view("GET")
def file_content_view(request, key, file_id):
    row = _own_file(key, file_id)
    try:
        handle = files.open_file(row)
    except FileNotFoundError:
        logger.warning("batch file %s is missing from the storage (%s)", row.id, row.storage_name)
        raise Refused(
            404, f"file {file_id} has no content in the storage", "file_not_found"
        ) from None
    return FileResponse(handle, content_type="application/octet-stream", filename=row.filename)


# ---- batches --------------------------------------------------------------------------


@openai_view("GET", "POST")
def batches_view(request, key):
    if request.method == "POST":
        try:
            body = json.loads(request.body or b"null")
        except ValueError as exc:
            raise Refused(400, f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise Refused(400, "the request body must be a JSON object")
        if body.get("output_expires_after") is not None:
            raise Refused(
                400,
                "llmgw does not expire batch output files: leave out output_expires_after",
                param="output_expires_after",
            )
        batch = lifecycle.create(
            key,
            input_file_id=body.get("input_file_id"),
            endpoint=body.get("endpoint"),
            completion_window=body.get("completion_window"),
            metadata=body.get("metadata"),
        )
        return JsonResponse(lifecycle.as_openai(batch))
    items, more = owners.page(
        owners.owned(Batch.objects, key),
        after=request.GET.get("after"),
        limit=_limit(request, 20, 100),
    )
    return _listing(items, more, lifecycle.as_openai)


def _own_batch(key, batch_id: str) -> Batch:
    batch = owners.owned(Batch.objects, key).filter(pk=batch_id).first()
    if batch is None:
        raise Refused(404, f"batch {batch_id} does not exist", "batch_not_found", "batch_id")
    return batch


@openai_view("GET")
def batch_view(request, key, batch_id):
    return JsonResponse(lifecycle.as_openai(_own_batch(key, batch_id)))


@openai_view("POST")
def batch_cancel_view(request, key, batch_id):
    return JsonResponse(lifecycle.as_openai(lifecycle.cancel(_own_batch(key, batch_id))))


@csrf_exempt
def unknown_view(request, rest=""):
    return _error(
        404,
        f"unknown path {request.path}: the Batch API serves /v1/files, /v1/files/<id>, "
        "/v1/files/<id>/content, /v1/batches, /v1/batches/<id> and /v1/batches/<id>/cancel",
        "unknown_url",
    )
