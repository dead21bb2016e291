"""API for maintenance windows: /api/v1/maintenance/ (everyone reads; staff write)."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.response import Response

from portal.api.serializers import StrictSerializer, error_responses
from portal.errors import NotFound
from portal.models import MaintenanceWindow
from portal.services.access import audit
from portal.services.fleet import maintenance
from portal.services.inventory.windows import window_nodes


class MaintenanceInput(StrictSerializer):
    nodes = serializers.ListField(
        child=serializers.CharField(max_length=253),
        required=False,
        default=list,
        max_length=maintenance.MAX_NODES,
        help_text="Host names; empty (and no network_group): every node.",
    )
    network_group = serializers.CharField(
        max_length=64, required=False, allow_blank=True, default=""
    )
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    reason = serializers.CharField(max_length=maintenance.MAX_REASON)


class MaintenanceChangeInput(MaintenanceInput):
    """Only the fields given change."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False
            field.default = serializers.empty


class CollisionOutput(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField()
    owner = serializers.CharField(source="owner.username")
    project = serializers.CharField(source="project.slug")


class MaintenanceOutput(serializers.Serializer):
    id = serializers.IntegerField()
    reason = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    network_group = serializers.CharField()
    nodes = serializers.SerializerMethodField(help_text="The host names it covers now.")
    all_nodes = serializers.SerializerMethodField(help_text="It covers every node.")
    state = serializers.SerializerMethodField(help_text="planned, under_way or over")

    def get_nodes(self, window) -> list[str]:
        return [node.hostname for node in window_nodes(window)]

    def get_all_nodes(self, window) -> bool:
        return not window.network_group and not window.nodes.exists()

    def get_state(self, window) -> str:
        now = timezone.now()
        return "planned" if now < window.start else "under_way" if now < window.end else "over"


class MaintenanceChangedOutput(MaintenanceOutput):
    collisions = serializers.SerializerMethodField(
        help_text="Running and planned bookings on its nodes during it (not ended by it)."
    )

    def get_collisions(self, window) -> list[dict]:
        return CollisionOutput(self.context["collisions"], many=True).data


class MaintenanceViewSet(viewsets.GenericViewSet):
    """Maintenance windows: list and read (everyone); create, change, delete (staff)."""

    serializer_class = MaintenanceOutput
    queryset = MaintenanceWindow.objects.prefetch_related("nodes").order_by("start", "id")

    def list(self, request):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(MaintenanceOutput(page, many=True).data)

    @extend_schema(responses={200: MaintenanceOutput, **error_responses(404)})
    def retrieve(self, request, pk=None):
        return Response(MaintenanceOutput(self._window(pk)).data)

    @extend_schema(
        request=MaintenanceInput,
        responses={201: MaintenanceChangedOutput, **error_responses(400, 403)},
    )
    def create(self, request):
        serializer = MaintenanceInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        spec = maintenance.WindowSpec(
            **{**serializer.validated_data, "nodes": tuple(serializer.validated_data["nodes"])}
        )
        window, collisions = maintenance.maintenance_create(
            actor=request.user, spec=spec, now=timezone.now(), source=_source(request)
        )
        return self._changed(window, collisions, status.HTTP_201_CREATED)

    @extend_schema(
        request=MaintenanceChangeInput,
        responses={200: MaintenanceChangedOutput, **error_responses(400, 403, 404)},
    )
    def partial_update(self, request, pk=None):
        serializer = MaintenanceChangeInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        window, collisions = maintenance.maintenance_update(
            actor=request.user,
            window_id=self._window(pk).pk,
            changes=dict(serializer.validated_data),
            now=timezone.now(),
            source=_source(request),
        )
        return self._changed(window, collisions, status.HTTP_200_OK)

    @extend_schema(responses={204: None, **error_responses(403, 404)})
    def destroy(self, request, pk=None):
        maintenance.maintenance_delete(
            actor=request.user, window_id=self._window(pk).pk, source=_source(request)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _window(self, pk) -> MaintenanceWindow:
        window = self.get_queryset().filter(pk=int(pk) if str(pk).isdigit() else 0).first()
        if window is None:
            raise NotFound(f"No maintenance window {pk}.")
        return window

    def _changed(self, window, collisions, code):
        window = self.get_queryset().get(pk=window.pk)
        output = MaintenanceChangedOutput(window, context={"collisions": collisions})
        return Response(output.data, status=code)


def _source(request) -> audit.Source:
    return audit.source_of(request, audit.Via.API)
