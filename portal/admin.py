"""Admin panel: admins set quotas here and see usage beside each limit."""

from django.contrib import admin
from django.utils import timezone

from portal.models import (
    Allocation,
    ApiToken,
    Booking,
    Gpu,
    Membership,
    MigInstance,
    Node,
    NodeAlert,
    Project,
    Quota,
)
from portal.services.quotas import DEFAULT_BUDGET_PERIOD_DAYS, usage_current


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


class QuotaInline(admin.StackedInline):
    model = Quota
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "member_count"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline, QuotaInline]

    @admin.display(description="members")
    def member_count(self, obj) -> int:
        return obj.memberships.count()


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = [
        "project",
        "user",
        "gpus_limit_and_use",
        "hours_limit_and_use",
        "max_duration_s",
        "fairshare_shares",
    ]
    list_filter = ["project"]
    list_select_related = ["project", "user"]
    autocomplete_fields = ["project", "user"]
    search_fields = ["project__slug", "user__username"]

    def _usage(self, obj):
        # Kept on the row (one request's object), not on this admin, which all requests share.
        if not hasattr(obj, "_usage"):
            period = obj.budget_period_days or DEFAULT_BUDGET_PERIOD_DAYS
            obj._usage = usage_current(
                project=obj.project, user=obj.user, now=timezone.now(), period_days=period
            )
        return obj._usage

    @admin.display(description="GPUs in use / limit")
    def gpus_limit_and_use(self, obj) -> str:
        limit = "∞" if obj.max_gpus is None else f"{obj.max_gpus:g}"
        return f"{self._usage(obj).gpus_in_use:g} / {limit}"

    @admin.display(description="GPU-hours used / budget")
    def hours_limit_and_use(self, obj) -> str:
        limit = "∞" if obj.gpu_hours_budget is None else f"{obj.gpu_hours_budget:g}"
        return f"{self._usage(obj).gpu_hours_used:.1f} / {limit}"


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "model", "memory_mib", "mig_mode"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "state", "state_reason", "last_seen", "agent_version"]
    list_filter = ["state"]
    search_fields = ["hostname"]
    exclude = ["agent_token_hash"]
    inlines = [GpuInline]
    actions = ["drain", "undrain"]

    @admin.action(description="Drain: finish running work, place nothing new")
    def drain(self, request, queryset):
        queryset.update(state=Node.State.DRAIN, state_reason=f"drained by {request.user.username}")

    @admin.action(description="Return to service")
    def undrain(self, request, queryset):
        queryset.filter(state=Node.State.DRAIN).update(state=Node.State.UP, state_reason="")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "model", "memory_mib", "mig_mode", "uuid"]
    list_filter = ["model", "mig_mode", "node"]
    search_fields = ["uuid", "node__hostname"]
    list_select_related = ["node"]


@admin.register(MigInstance)
class MigInstanceAdmin(admin.ModelAdmin):
    list_display = ["__str__", "profile", "slices", "memory_mib", "uuid"]
    list_filter = ["profile"]
    search_fields = ["uuid"]
    list_select_related = ["gpu__node"]


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    fields = ["gpu", "mig_instance", "start", "end", "live"]
    readonly_fields = fields
    can_delete = False


@admin.register(Booking)
class BookingAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "owner",
        "project",
        "describe_request",
        "state",
        "qos",
        "submitted_at",
        "planned_start",
    ]
    list_filter = ["state", "qos", "project"]
    search_fields = ["owner__username", "project__slug"]
    list_select_related = ["owner", "project"]
    readonly_fields = ["priority", "queue_position", "pending_reason", "exit_code", "log_tail"]
    inlines = [AllocationInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created", "last_used"]
    search_fields = ["user__username", "name"]
    readonly_fields = ["key_hash", "prefix"]


@admin.register(NodeAlert)
class NodeAlertAdmin(admin.ModelAdmin):
    """Processes the node agents objected to (foreign or on unbooked devices); read-only."""

    list_display = ["time", "node", "kind", "device_uuid", "pid", "user", "action", "booking"]
    list_filter = ["kind", "action", "node"]
    search_fields = ["node__hostname", "device_uuid", "user", "detail"]
    raw_id_fields = ["booking", "owner"]
    ordering = ["-time", "-id"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


# Notifications: deliveries, idle reclaims, project channels (kept beside, not in, this module).
from portal import admin_notifications  # noqa: E402,F401
