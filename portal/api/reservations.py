"""/api/v1/reservations/: project reservations. Staff create, change and delete them; everyone
lists them (members see their projects')."""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.response import Response

from portal.api import serializers as s
from portal.api.pagination import OrderedPagination
from portal.errors import NotAllowed, NotFound
from portal.models import ProjectReservation
from portal.services.booking import project_reservations as service
from portal.services.reporting.reservations import reserved_gpus, windows_use

# Windows of each reservation listed from now on (its next ones, or the one open now).
LISTED_WINDOWS = 4
_AHEAD = timedelta(days=7 * LISTED_WINDOWS)


class ReservationInput(s.StrictSerializer):
    project = serializers.CharField(max_length=64)
    gpus = serializers.IntegerField(min_value=1, max_value=100_000, required=False, allow_null=True)
    gpu_model = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    nodes = serializers.ListField(
        child=serializers.CharField(max_length=253),
        required=False,
        default=list,
        max_length=service.MAX_NODES,
    )
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    weekly = serializers.BooleanField(required=False, default=False)
    idle_release_minutes = serializers.IntegerField(
        min_value=1, max_value=service.MAX_IDLE_RELEASE_MINUTES, required=False, allow_null=True
    )
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class WindowUseOutput(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    reserved_gpu_hours = serializers.FloatField(help_text="up to now")
    used_gpu_hours = serializers.FloatField(help_text="by the project's bookings, up to now")
    unused_gpu_hours = serializers.FloatField()
    in_use_now = serializers.FloatField(help_text="GPU-equivalents members hold on it now")


class ReservationOutput(serializers.Serializer):
    id = serializers.IntegerField()
    project = serializers.CharField(source="project.slug")
    gpus = serializers.IntegerField(allow_null=True, help_text="null: every GPU of the nodes")
    reserved_gpus = serializers.SerializerMethodField()
    gpu_model = serializers.CharField()
    nodes = serializers.SerializerMethodField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    weekly = serializers.BooleanField()
    idle_release_minutes = serializers.IntegerField(allow_null=True)
    note = serializers.CharField()
    windows = serializers.SerializerMethodField()

    def get_nodes(self, obj) -> list[str]:
        return sorted(n.hostname for n in obj.nodes.all())

    def get_reserved_gpus(self, obj) -> int:
        return reserved_gpus(obj)

    @extend_schema_field(WindowUseOutput(many=True))
    def get_windows(self, obj) -> list[dict]:
        now = self.context.get("now") or timezone.now()
        uses = windows_use([obj], since=now, until=now + _AHEAD, now=now)[:LISTED_WINDOWS]
        return [
            {
                "start": u.start,
                "end": u.end,
                "reserved_gpu_hours": round(u.reserved_gpu_hours, 3),
                "used_gpu_hours": round(u.used_gpu_hours, 3),
                "unused_gpu_hours": round(u.unused_gpu_hours, 3),
                "in_use_now": u.in_use_now,
            }
            for u in uses
        ]


def _spec(data: dict):
    return service.reservation_spec(now=timezone.now(), **data)


def _valid(serializer_class, data, **kw) -> dict:
    serializer = serializer_class(data=data, **kw)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class ReservationViewSet(viewsets.ViewSet):
    """Project reservations: list and see (members: their projects'), create, change and
    delete (staff). A change never ends a booking; the queue is re-planned after it."""

    # Only for the schema (the id's type); every read goes through the service's selector.
    queryset = ProjectReservation.objects.none()

    def _render(self, reservation, code=status.HTTP_200_OK):
        fresh = service.visible_reservations(self.request.user).get(pk=reservation.pk)
        return Response(ReservationOutput(fresh).data, status=code)

    @extend_schema(responses={200: ReservationOutput(many=True)})
    def list(self, request):
        paginator = OrderedPagination()
        page = paginator.paginate_queryset(service.visible_reservations(request.user), request)
        return paginator.get_paginated_response(ReservationOutput(page, many=True).data)

    @extend_schema(responses={200: ReservationOutput, **s.error_responses(404)})
    def retrieve(self, request, pk=None):
        found = service.visible_reservations(request.user).filter(pk=_pk(pk)).first()
        if found is None:
            raise NotFound(f"No reservation {pk}.")
        return Response(ReservationOutput(found).data)

    @extend_schema(
        request=ReservationInput,
        responses={201: ReservationOutput, **s.error_responses(400, 403)},
    )
    def create(self, request):
        if not request.user.is_staff:
            raise NotAllowed("Only staff may reserve capacity for a project.")
        spec = _spec(_valid(ReservationInput, request.data))
        reservation = service.reservation_create(user=request.user, spec=spec)
        return self._render(reservation, status.HTTP_201_CREATED)

    @extend_schema(
        request=ReservationInput,
        responses={200: ReservationOutput, **s.error_responses(400, 403, 404)},
    )
    def update(self, request, pk=None):
        reservation = service.reservation_for_staff(user=request.user, pk=pk)
        spec = _spec(_valid(ReservationInput, request.data))
        return self._render(service.reservation_update(reservation=reservation, spec=spec))

    @extend_schema(responses={204: None, **s.error_responses(403, 404)})
    def destroy(self, request, pk=None):
        reservation = service.reservation_for_staff(user=request.user, pk=pk)
        service.reservation_delete(reservation=reservation)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _pk(pk) -> int:
    try:
        return int(pk)
    except (TypeError, ValueError):
        return 0
