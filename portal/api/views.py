"""API views: interfaces that parse input, call one service or selector, and render output."""

from django.conf import settings
from django.contrib.auth import authenticate
from django.db.models import Count, F, Prefetch
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle
from rest_framework.views import APIView

from portal.api import lists
from portal.api import serializers as s
from portal.api.csv_renderer import CsvRenderer
from portal.api.pagination import OrderedPagination
from portal.api.serializers import node_runs_shown
from portal.errors import NotAllowed, NotFound, TooManyAttempts, ValidationFailed
from portal.filtersets import BookingFilterSet, GpuFilterSet, MigInstanceFilterSet, NodeFilterSet
from portal.models import Allocation, ApiToken, Booking, Gpu, MigInstance, Node
from portal.services.access import audit, login_throttle, permissions
from portal.services.access import selectors as access_selectors
from portal.services.access import tokens as token_services
from portal.services.allocation.estimate import booking_estimate
from portal.services.booking import bookings as booking_services
from portal.services.booking import selectors as booking_selectors
from portal.services.booking.arrays import array_cancel
from portal.services.booking.idempotency import booking_submit_once
from portal.services.booking.quotas import quota_overview
from portal.services.fleet import selectors as fleet_selectors
from portal.services.fleet import sharing as gpu_sharing
from portal.services.inventory import telemetry_cache
from portal.services.inventory.resources import held_now_by_node
from portal.services.reporting.accounting import accounting_report, report_columns


class TokenThrottle(AnonRateThrottle):
    scope = "token"

    def get_ident(self, request):
        return login_throttle.client_address(request)


class EstimateThrottle(UserRateThrottle):
    """ESTIMATE_RATE per user (read per request, so a changed setting applies at once)."""

    scope = "estimate"

    def get_rate(self):
        return settings.ESTIMATE_RATE


class TokenCreateView(APIView):
    """Exchange a username and password for an API token (shown once)."""

    permission_classes = [AllowAny]
    authentication_classes: list = []
    throttle_classes = [TokenThrottle]

    @extend_schema(
        request=s.TokenCreateInput,
        responses={201: s.TokenCreatedOutput, **s.error_responses(400, 429)},
    )
    def post(self, request):
        data = _valid(s.TokenCreateInput, request.data)
        wait = login_throttle.wait_s(request, data["username"])
        if wait:
            raise TooManyAttempts(login_throttle.message(wait), retry_after_s=wait)
        user = authenticate(request, username=data["username"], password=data["password"])
        if user is None:
            login_throttle.record_failure(request, data["username"])
            raise ValidationFailed(
                "Wrong username or password.", fields={"password": "wrong username or password"}
            )
        source = audit.source_of(request, audit.Via.API)
        audit.audit_record(action="login", actor=user, source=source, after={"for": "api token"})
        return _token_created(
            request, user, {k: v for k, v in data.items() if k not in ("username", "password")}
        )


def _token_created(request, user, data: dict) -> Response:
    raw, token = token_services.token_create(
        user=user,
        now=timezone.now(),
        name=data.get("name", ""),
        scope=data["scope"],
        expires_at=data["expires_at"],
        source=_source(request),
    )
    body = {
        "token": raw,
        "id": token.id,
        "name": token.name,
        "scope": token.scope,
        "expires_at": token.expires_at,
    }
    return Response(s.TokenCreatedOutput(body).data, status=status.HTTP_201_CREATED)


class TokenViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """My API tokens: list them (with last use), create one (POST), revoke one (DELETE)."""

    serializer_class = s.TokenOutput

    queryset = ApiToken.objects.none()  # for the schema; real rows come from get_queryset

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset
        return access_selectors.tokens_of(user=self.request.user)

    @extend_schema(request=s.TokenNewInput, responses={201: s.TokenCreatedOutput})
    def create(self, request):
        """A new token for me; its key is in this answer only."""
        return _token_created(request, request.user, _valid(s.TokenNewInput, request.data))

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        token_services.token_revoke(
            actor=request.user, token_id=_pk(pk, "token"), source=_source(request)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """GPU nodes and their state."""

    serializer_class = s.NodeOutput
    filterset_class = NodeFilterSet
    queryset = Node.objects.annotate(
        gpu_count=Count("gpus"), last_seen=F("heartbeat__last_seen")
    ).order_by("hostname", "id")

    def get_serializer(self, *args, **kwargs):
        # The cores and memory held now, read once for the page (or the one node) shown.
        if args:
            nodes = args[0] if kwargs.get("many") else [args[0]]
            context = kwargs.setdefault("context", self.get_serializer_context())
            context["allocated"] = held_now_by_node(timezone.now(), [n.pk for n in nodes])
        return super().get_serializer(*args, **kwargs)

    @extend_schema(
        request=s.SharingInput,
        responses={200: s.SharingOutput, **s.error_responses(400, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"])
    def sharing(self, request, pk=None):
        """Put every GPU of the node not in MIG mode in a sharing mode (staff): all or none,
        409 when one holds live bookings of the other kind."""
        data = _valid(s.SharingInput, request.data)
        node = self.get_object()
        changed = gpu_sharing.node_set_sharing(
            actor=request.user,
            node_id=node.pk,
            sharing=data["sharing"],
            now=timezone.now(),
            source=_source(request),
        )
        return Response({"node": node.hostname, "sharing": data["sharing"], "changed": changed})


_HISTORY_PARAMETERS = [
    OpenApiParameter("from", OpenApiTypes.DATETIME, description="default: 1 hour before `to`"),
    OpenApiParameter("to", OpenApiTypes.DATETIME, description="default: now"),
    OpenApiParameter(
        "resolution",
        str,
        enum=["auto", "raw", "minute"],
        description="raw samples, minute averages, or auto (raw within raw retention)",
    ),
    OpenApiParameter("max_points", int, description="1-10000, default 1500 (runs averaged)"),
]


def _history_query(request) -> dict:
    return _valid(s.HistoryQuery, {k: v for k, v in request.query_params.items()})


def _device_history(uuid: str, label: str, query: dict) -> dict:
    resolution = fleet_selectors.history_resolution(
        since=query["since"], resolution=query["resolution"]
    )
    points = fleet_selectors.samples_history(
        uuid=uuid,
        since=query["since"],
        until=query["until"],
        max_points=query["max_points"],
        resolution=resolution,
    )
    return {
        "uuid": uuid,
        "device": label,
        "resolution": resolution,
        "points": s.HistoryPointOutput(points, many=True).data,
    }


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """Physical GPUs, with their latest reading; those in MIG mode list their instances."""

    serializer_class = s.GpuOutput
    filterset_class = GpuFilterSet
    queryset = (
        Gpu.objects.select_related("node")
        .prefetch_related("mig_instances")
        .order_by("node__hostname", "index", "id")
    )

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(
            self.filter_queryset(self.get_queryset()).values(*lists.GPU_FIELDS)
        )
        return self.get_paginated_response(lists.gpu_rows(page))

    def retrieve(self, request, *args, **kwargs):
        gpu = self.get_object()
        readings = telemetry_cache.latest_by_uuid([gpu.uuid])
        return Response(s.GpuOutput(gpu, context={"readings": readings}).data)

    @extend_schema(
        request=s.SharingInput,
        responses={200: s.GpuOutput, **s.error_responses(400, 403, 404, 409)},
    )
    def partial_update(self, request, *args, **kwargs):
        """Put the GPU in a sharing mode (staff): exclusive (whole, or MIG slices, to one
        booking) or shared (fractions to several); 409 while it holds live bookings of the
        other kind, or when it is in MIG mode."""
        data = _valid(s.SharingInput, request.data)
        gpu = gpu_sharing.gpu_set_sharing(
            actor=request.user,
            gpu_id=self.get_object().pk,
            sharing=data["sharing"],
            now=timezone.now(),
            source=_source(request),
        )
        readings = telemetry_cache.latest_by_uuid([gpu.uuid])
        return Response(s.GpuOutput(gpu, context={"readings": readings}).data)

    @extend_schema(parameters=_HISTORY_PARAMETERS, responses={200: s.DeviceHistoryOutput})
    @action(detail=True, methods=["get"])
    def history(self, request, pk=None):
        """The GPU's readings over a time range, raw or as minute averages."""
        gpu = self.get_object()
        label = f"{gpu.node.hostname}/gpu{gpu.index}"
        return Response(_device_history(gpu.uuid, label, _history_query(request)))


class MigInstanceViewSet(viewsets.ReadOnlyModelViewSet):
    """MIG instances, each a bookable device, with their latest reading."""

    serializer_class = s.MigInstanceOutput
    filterset_class = MigInstanceFilterSet
    queryset = MigInstance.objects.select_related("gpu__node").order_by(
        "gpu__node__hostname", "gpu__index", "id"
    )

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "readings": getattr(self, "_readings", {})}

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        self._readings = telemetry_cache.latest_by_uuid([m.uuid for m in page])
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def retrieve(self, request, *args, **kwargs):
        instance = self.get_object()
        self._readings = telemetry_cache.latest_by_uuid([instance.uuid])
        return Response(self.get_serializer(instance).data)

    @extend_schema(parameters=_HISTORY_PARAMETERS, responses={200: s.DeviceHistoryOutput})
    @action(detail=True, methods=["get"])
    def history(self, request, pk=None):
        """The instance's readings over a time range (memory and processes: NVML gives no
        utilization, temperature or power per MIG instance)."""
        mig = self.get_object()
        label = str(mig)
        return Response(_device_history(mig.uuid, label, _history_query(request)))


def _source(request) -> audit.Source:
    return audit.source_of(request, audit.Via.API)


def _valid(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class BookingViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Bookings: submit, list, see one, cancel, release, extend."""

    serializer_class = s.BookingOutput
    filterset_class = BookingFilterSet
    queryset = Booking.objects.none()  # for the schema; real rows come from get_queryset

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset
        allocations = Prefetch(
            "allocations", queryset=Allocation.objects.select_related("gpu__node", "mig_instance")
        )
        return (
            booking_selectors.visible_bookings(self.request.user)
            .select_related("owner", "project")
            .prefetch_related(allocations, Prefetch("node_runs", queryset=node_runs_shown()))
            .order_by("-submitted_at", "-id")
        )

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(
            lists.booking_values(self.filter_queryset(self.get_queryset()))
        )
        return self.get_paginated_response(lists.booking_rows(page))

    def _render(self, booking, code=status.HTTP_200_OK):
        return Response(s.BookingOutput(self.get_queryset().get(pk=booking.pk)).data, status=code)

    @extend_schema(
        request=s.BookingCreateInput,
        responses={
            201: s.BookingOutput,
            200: OpenApiResponse(
                s.BookingOutput, "the booking an earlier request with this key made"
            ),
            **s.error_responses(400, 409, 422, 503),
        },
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="At most 200 characters, one per booking. Retrying with the same key "
                "and body returns the first booking (200); the same key with another body: 422.",
            )
        ],
    )
    def create(self, request, *args, **kwargs):
        data = _valid(s.BookingCreateInput, request.data)
        booking, created = booking_submit_once(
            user=request.user,
            now=timezone.now(),
            key=request.headers.get("Idempotency-Key", ""),
            source=_source(request),
            **data,
        )
        return self._render(booking, status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        request=s.BookingCreateInput,
        responses={200: s.EstimateOutput, **s.error_responses(400, 409, 429, 503)},
    )
    @action(detail=False, methods=["post"], throttle_classes=[EstimateThrottle])
    def estimate(self, request):
        """When would this booking start if submitted now, and why not sooner? Writes nothing.
        Refused as a submission would be; at most ESTIMATE_RATE a user."""
        data = _valid(s.BookingCreateInput, request.data)
        result = booking_estimate(user=request.user, now=timezone.now(), **data)
        return Response(s.EstimateOutput(result).data)

    def retrieve(self, request, *args, **kwargs):
        booking = self.get_queryset().filter(pk=_pk(kwargs["pk"])).first()
        if booking is None:
            raise NotFound(f"No booking {kwargs['pk']} among yours.")
        return Response(s.BookingOutput(booking).data)

    @extend_schema(request=None, responses={200: s.BookingOutput, **s.error_responses(404, 409)})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        booking = booking_services.booking_cancel(
            user=request.user, booking_id=_pk(pk), now=timezone.now(), source=_source(request)
        )
        return self._render(booking)

    @extend_schema(
        request=None, responses={200: s.ArrayCancelOutput, **s.error_responses(404, 409)}
    )
    @action(detail=True, methods=["post"], url_path="cancel-array")
    def cancel_array(self, request, pk=None):
        """Cancel every task of the job array this booking (its first task) names that has not
        ended, in one call; its owner hears of it in one message."""
        done = array_cancel(
            user=request.user, array_id=_pk(pk), now=timezone.now(), source=_source(request)
        )
        return Response(s.ArrayCancelOutput(done).data)

    @extend_schema(request=None, responses={200: s.BookingOutput, **s.error_responses(404, 409)})
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        booking = booking_services.booking_release(
            user=request.user, booking_id=_pk(pk), now=timezone.now(), source=_source(request)
        )
        return self._render(booking)

    @extend_schema(parameters=_HISTORY_PARAMETERS, responses={200: s.BookingHistoryOutput})
    @action(detail=True, methods=["get"])
    def history(self, request, pk=None):
        """Readings of the booking's devices; the range defaults to when it held them."""
        booking = self.get_queryset().filter(pk=_pk(pk)).first()
        if booking is None:
            raise NotFound(f"No booking {pk} among yours.")
        allocations = [
            a
            for a in booking.allocations.all()
            if s.allocation_shown(
                live=a.live, start=a.start, state=booking.state, requeued_at=booking.requeued_at
            )
        ]
        params = dict(request.query_params.items())
        if allocations and "from" not in params:
            params["from"] = min(a.start for a in allocations).isoformat()
        if allocations and "to" not in params:
            params["to"] = min(timezone.now(), max(a.end for a in allocations)).isoformat()
        query = _valid(s.HistoryQuery, params)
        devices = [_device_history(a.device_uuid, a.device_label, query) for a in allocations]
        resolution = fleet_selectors.history_resolution(
            since=query["since"], resolution=query["resolution"]
        )
        return Response({"booking": booking.pk, "resolution": resolution, "devices": devices})

    @extend_schema(
        request=s.BookingExtendInput,
        responses={200: s.BookingOutput, **s.error_responses(400, 404, 409, 503)},
    )
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        data = _valid(s.BookingExtendInput, request.data)
        booking = booking_services.booking_extend(
            user=request.user,
            booking_id=_pk(pk),
            now=timezone.now(),
            by_s=data["by_s"],
            source=_source(request),
        )
        return self._render(booking)


def _pk(pk, what: str = "booking") -> int:
    try:
        return int(pk)
    except (TypeError, ValueError) as exc:
        raise NotFound(f"No {what} {pk}.") from exc


class AccountingView(APIView):
    """GPU-hours, energy and efficiency per project, user, GPU model or booking over a period,
    as JSON or CSV (like Slurm's sreport). Staff see every project; others their own."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "group_by", str, enum=["project", "user", "model", "booking"], required=True
            ),
            OpenApiParameter("from", OpenApiTypes.DATETIME, required=True),
            OpenApiParameter("to", OpenApiTypes.DATETIME, description="default: now"),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses={200: s.AccountingRowOutput(many=True)},
    )
    def get(self, request):
        query = _valid(s.AccountingQuery, dict(request.query_params.items()))
        rows = accounting_report(
            since=query["since"],
            until=query["until"],
            group_by=query["group_by"],
            now=timezone.now(),
            user=request.user,
        )
        response = Response(rows)
        self.csv_columns = report_columns(query["group_by"])
        if getattr(request.accepted_renderer, "format", "") == "csv":
            name = f"gpu-accounting-{query['group_by']}-{query['since']:%Y%m%d}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response


class MyQuotaView(APIView):
    """My limits and current usage in each of my projects."""

    @extend_schema(responses={200: s.MyQuotaOutput})
    def get(self, request):
        return Response({"results": quota_overview(user=request.user, now=timezone.now())})


class AuditView(APIView):
    """The audit log, newest first, with filters; `?format=csv` exports every match.
    Staff and superusers read all of it; a project manager reads their projects' events."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("action", str, description='e.g. "booking.cancel" or "booking."'),
            OpenApiParameter("actor", str, description="username"),
            OpenApiParameter("project", str, description="project slug"),
            OpenApiParameter("target_type", str),
            OpenApiParameter("target_id", str),
            OpenApiParameter("from", OpenApiTypes.DATETIME),
            OpenApiParameter("to", OpenApiTypes.DATETIME),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses={200: s.AuditEventOutput(many=True)},
    )
    def get(self, request):
        if not permissions.can_some(request.user, "audit.view"):
            raise NotAllowed("Only staff and project managers may read the audit log.")
        query = _valid(s.AuditQuery, dict(request.query_params.items()))
        events = access_selectors.audit_events_filter(
            access_selectors.audit_events_visible(request.user),
            **{k: v for k, v in query.items() if k not in ("format", "page", "page_size")},
        )
        if getattr(request.accepted_renderer, "format", "") == "csv":
            limit = settings.AUDIT_EXPORT_MAX_ROWS
            rows = [access_selectors.audit_row(e, text=True) for e in events[:limit].iterator()]
            response = Response(rows)
            response["Content-Disposition"] = 'attachment; filename="gpu-portal-audit.csv"'
            return response
        paginator = OrderedPagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response([access_selectors.audit_row(e) for e in page])
