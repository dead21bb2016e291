"""API for the site's history as a trace: GET /api/v1/history/ (staff only)."""

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api import serializers as s
from portal.api.csv_renderer import CsvRenderer
from portal.api.serializers import StrictSerializer
from portal.errors import NotAllowed
from portal.services.reporting import site_history as history


class HistoryQuery(StrictSerializer):
    days = serializers.IntegerField(min_value=1, max_value=history.MAX_DAYS, default=30)
    real_names = serializers.BooleanField(default=False)
    format = serializers.ChoiceField(choices=["json", "csv"], required=False)


class SiteHistoryView(APIView):
    """The ended bookings submitted in the last `days` as the replay's trace (CSV with
    `?format=csv`, else JSON with the inventory), users and projects pseudonymised unless
    `real_names=true`. Staff only; reads only."""

    renderer_classes = [JSONRenderer, CsvRenderer]
    csv_columns = list(history.COLUMNS)

    @extend_schema(
        parameters=[
            OpenApiParameter("days", int, description=f"1 to {history.MAX_DAYS} (default 30)"),
            OpenApiParameter("real_names", OpenApiTypes.BOOL, description="default: pseudonyms"),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses={200: OpenApiTypes.OBJECT, **s.error_responses(400, 403)},
    )
    def get(self, request):
        if not request.user.is_staff:
            raise NotAllowed("Only staff may export the site's history.")
        serializer = HistoryQuery(data=dict(request.query_params.items()))
        serializer.is_valid(raise_exception=True)
        query = serializer.validated_data
        trace = history.site_history(
            days=query["days"], now=timezone.now(), real_names=query["real_names"]
        )
        if getattr(request.accepted_renderer, "format", "") == "csv":
            response = Response(trace.rows)
            name = f"gpu-portal-history-{trace.since:%Y%m%d}-{trace.until:%Y%m%d}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
            return response
        return Response(history.trace_json(trace))
