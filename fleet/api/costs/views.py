"""The routes of prices and costs: ``prices/``, and ``costs/`` as JSON or CSV.

Its one reason to change: how a price is set and a cost report asked for and rendered
(its period, its grouping, its CSV) through the API.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, time

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response

from fleet.models import CostHour, Price
from fleet.services import cost_scope, costs, permissions

from ..common import field_errors
from .serializers import CostReportSerializer, PriceSerializer


class PriceViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """What an hour of each GPU class costs, from a date on, with every price it had."""

    queryset = Price.objects.all()
    serializer_class = PriceSerializer
    filterset_fields = ("gpu_class", "currency")
    search_fields = ("gpu_class",)
    ordering_fields = ("gpu_class", "effective_from")
    action_permissions = {"create": list(permissions.needs("price.set"))}

    def create(self, request, *args, **kwargs):
        """Set a class's price from ``effective_from`` on: a new price, the one before it
        kept for the hours before. One of the same class and date is replaced. Hours
        counted already from that date are priced again at once."""
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            price = costs.set_price(
                data.get("gpu_class", ""),
                data["per_hour"],
                data.get("currency"),
                data["effective_from"],
                actor=request.user,
            )
        except DjangoValidationError as exc:
            raise ValidationError(field_errors(exc)) from None
        return Response(self.get_serializer(price).data, status=status.HTTP_201_CREATED)


BY_CHOICES = ("team", "model", "gpu_class")
CSV_COLUMNS = ("start", "end", "team", "model", "gpu_class", "idle", "gpu_hours", "cost",
               "currency", "tokens", "cost_per_million_tokens", "utilisation")  # fmt: skip


class CSVRenderer(BaseRenderer):
    """A cost report as CSV: one line per row, then the idle ones; no totals (a
    spreadsheet sums them, and would count them twice). An empty cell is unknown
    (no tokens, no peak) or not reported by, never 0."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(CSV_COLUMNS)
        for row in [*data["rows"], *data["idle"]]:
            line = {**row, "start": data["start"], "end": data["end"]}
            writer.writerow([_cell(line[c]) for c in CSV_COLUMNS])
        return out.getvalue().encode(self.charset)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    # A name that a spreadsheet would run as a formula (GPU names come from agents).
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text


def _when(name: str, text: str | None, default: datetime) -> datetime:
    if not text:
        return default
    text = text.strip()
    try:
        found = parse_datetime(text.replace("Z", "+00:00"))
        day = None if found else parse_date(text)
    except ValueError:
        found = day = None
    if day is not None:
        found = datetime.combine(day, time.min)
    if found is None:
        raise ValidationError(
            {name: [f"'{text}' is neither a date (2026-01-31) nor an ISO 8601 time"]}
        )
    return found if timezone.is_aware(found) else found.replace(tzinfo=UTC)


def period(params) -> tuple[datetime, datetime]:
    """``start`` and ``end`` of a query: dates or times (UTC); by default, this UTC month so
    far. ValidationError naming the parameter."""
    now = timezone.now()
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start = _when("start", params.get("start"), month)
    end = _when("end", params.get("end"), now)
    if end <= start:
        raise ValidationError(
            {"end": [f"{end.isoformat()} is not after start {start.isoformat()}"]}
        )
    return start, end


def by_of(text: str | None) -> tuple[str, ...]:
    if not text:
        return ("team", "model")
    by = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [b for b in by if b not in BY_CHOICES]
    if bad or not by:
        raise ValidationError(
            {"by": [f"'{text}': costs are reported by any of {', '.join(BY_CHOICES)}, "
                    "comma-separated"]}
        )  # fmt: skip
    return by


def report_for(user, start: datetime, end: datetime, by) -> dict:
    """The report as the API answers it, narrowed to what ``user`` sees."""
    seen = cost_scope.seen_by(user)
    found = costs.report(start, end, by, within=seen.within)
    return {
        "start": found.start,
        "end": found.end,
        "by": list(found.by),
        "seen": seen.describe(),
        "rows": [r.as_dict() for r in found.rows],
        "idle": [r.as_dict() for r in found.idle] if seen.idle else [],
        "totals": [r.as_dict() for r in found.totals],
        "unpriced": found.unpriced if seen.idle else [],
    }


class OneReportSchema(AutoSchema):
    """``GET costs/`` is a list route that answers one report, not a list of them."""

    def _is_list_view(self, serializer=None) -> bool:
        return False


class CostViewSet(viewsets.ViewSet):
    """What the fleet cost over a period, by team, model or GPU, with the idle apart."""

    queryset = CostHour.objects.none()  # reading needs fleet.view_costhour
    renderer_classes = [JSONRenderer, CSVRenderer]
    schema = OneReportSchema()

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "start", str, description="A date (2026-11-01) or ISO 8601 time, UTC unless "
                "it says; whole hours from the one it falls in. Default: this UTC month's start."
            ),
            OpenApiParameter(
                "end", str, description="As start; the hour it falls in is the last. "
                "Default: now."
            ),
            OpenApiParameter(
                "by", str, description="team, model, gpu_class or several, comma-separated "
                "(default team,model)."
            ),
            OpenApiParameter(
                "format", str, enum=["json", "csv"], description="csv: the rows as a CSV "
                "file (as Accept: text/csv)."
            ),
        ],
        responses={
            (200, "application/json"): CostReportSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
        },
    )  # fmt: skip
    def list(self, request):
        start, end = period(request.query_params)
        by = by_of(request.query_params.get("by"))
        data = CostReportSerializer(report_for(request.user, start, end, by)).data
        response = Response(data)
        if request.accepted_renderer.format == "csv":
            stamp = f"{data['start'][:10]}_{data['end'][:10]}"
            response["Content-Disposition"] = f'attachment; filename="llmgw-costs-{stamp}.csv"'
        return response

    def perform_content_negotiation(self, request, force=False):
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:  # DRF's answer to a ?format= no renderer has: a wrong parameter
            given = request.query_params.get("format", "")
            raise ValidationError(
                {"format": [f"'{given}' is not a format costs come in: json or csv"]}
            ) from None

    def finalize_response(self, request, response, *args, **kwargs):
        # Errors are JSON, whatever the request asked for (fleet/api/exceptions.py), and
        # so is anything but the report (OPTIONS' description of the route).
        if response.status_code >= 400 or request.method != "GET":
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)
