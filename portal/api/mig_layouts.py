"""MIG layout API: a GPU's layout and what its model allows; staff set a new one, and see,
approve or cancel the changes (portal.services.inventory.mig_layouts does the work)."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.errors import NotAllowed, NotFound
from portal.models import Gpu, MigLayoutChange
from portal.services.access import audit, permissions
from portal.services.allocation import mig_changes
from portal.services.inventory import mig_layouts
from scheduler.mig_layout import mig_model


class MigLayoutChangeOutput(serializers.ModelSerializer):
    """A change of one GPU's MIG layout and how far it got."""

    gpu = serializers.CharField(source="gpu.__str__", read_only=True)
    gpu_id = serializers.IntegerField(read_only=True)
    requested_by = serializers.CharField(source="requested_by.username", default=None)

    class Meta:
        model = MigLayoutChange
        fields = [
            "id",
            "gpu_id",
            "gpu",
            "state",
            "layout",
            "previous",
            "planned_at",
            "detail",
            "requested_by",
            "created",
            "applying_since",
            "finished_at",
        ]
        read_only_fields = fields


class _Instance(serializers.Serializer):
    profile = serializers.CharField()
    start = serializers.IntegerField(required=False, allow_null=True)


_LayoutInput = inline_serializer("MigLayoutInput", {"instances": _Instance(many=True)})


def _gpu(pk: str) -> Gpu:
    gpu = None
    if pk.isascii() and pk.isdigit() and len(pk) < 19:
        gpu = Gpu.objects.select_related("node").filter(pk=int(pk)).first()
    if gpu is None:
        raise NotFound(f"No GPU {pk}.")
    return gpu


class GpuMigLayoutView(APIView):
    """GET: the GPU's MIG layout, the profiles its model allows and its latest change.
    PUT/PATCH (staff): ask for a new layout; it is planned for when its slices are free."""

    @extend_schema(responses={200: dict})
    def get(self, request, pk: str):
        gpu = _gpu(pk)
        table = mig_model(gpu.model, gpu.memory_mib)
        latest = MigLayoutChange.objects.filter(gpu=gpu).order_by("-created", "-id").first()
        return Response(
            {
                "gpu": str(gpu),
                "mig_mode": gpu.mig_mode,
                "instances": mig_layouts.gpu_mig_layout(gpu=gpu),
                "allowed": None if table is None else _allowed(table),
                "change": None if latest is None else MigLayoutChangeOutput(latest).data,
            }
        )

    @extend_schema(request=_LayoutInput, responses={202: MigLayoutChangeOutput})
    def put(self, request, pk: str):
        body = request.data if isinstance(request.data, dict) else {}
        change = mig_changes.mig_layout_request(
            gpu_id=_gpu(pk).pk,
            instances=body.get("instances"),
            by=request.user,
            source=audit.source_of(request, audit.Via.API),
        )
        return Response(MigLayoutChangeOutput(change).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=_LayoutInput, responses={202: MigLayoutChangeOutput})
    def patch(self, request, pk: str):
        return self.put(request, pk)


def _allowed(table) -> dict:
    return {
        "model": table.key,
        "compute_slices": table.compute_slices,
        "memory_slices": table.memory_slices,
        "profiles": [
            {
                "profile": p.name,
                "slices": p.slices,
                "memory_slices": p.size,
                "starts": list(p.starts),
                "max_count": p.max_count,
            }
            for p in table.profiles
        ],
    }


class MigLayoutChangeViewSet(viewsets.ReadOnlyModelViewSet):
    """MIG layout changes, newest first (staff): requested, planned, applying, done, failed."""

    serializer_class = MigLayoutChangeOutput
    queryset = MigLayoutChange.objects.select_related("gpu__node", "requested_by").order_by(
        "-created", "-id"
    )

    def get_queryset(self):
        if not permissions.can(self.request.user, "gpu.mig_layout"):
            raise NotAllowed("Only admins with the right to change GPUs see MIG layout changes.")
        return super().get_queryset()

    @extend_schema(request=None, responses={200: MigLayoutChangeOutput})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Approve a change the allocator proposed (MIG_AUTO_LAYOUT=propose)."""
        change = mig_changes.mig_layout_approve(change_id=int(pk), by=request.user)
        return Response(MigLayoutChangeOutput(change).data)

    @extend_schema(request=None, responses={200: MigLayoutChangeOutput})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel a change that is not applying yet."""
        change = mig_changes.mig_layout_cancel(change_id=int(pk), by=request.user)
        return Response(MigLayoutChangeOutput(change).data)
