"""Admin panel: admins set quotas here and see usage beside each limit.

Quota, membership and node changes, drains, token revocations and logins are audited
(portal/admin_audit.py); the audit log itself is read-only here, with a CSV export.
"""

from django.contrib import admin, messages
from django.db.models import F
from django.http import HttpResponse
from django.utils import timezone

from portal.admin_audit import AuditedAdminMixin
from portal.admin_quota import QuotaForm, duration_text, gpus_held_text, hours_used_text
from portal.csv_cells import csv_dict_writer
from portal.errors import ApplicationError
from portal.models import (
    Allocation,
    ApiToken,
    AuditEvent,
    Booking,
    DomainEvent,
    Gpu,
    GroupMappingRule,
    Membership,
    MigInstance,
    Node,
    NodeAlert,
    Project,
    Quota,
)
from portal.services.access import tokens as token_services
from portal.services.access.audit import Via, source_of
from portal.services.access.selectors import CSV_COLUMNS, audit_row
from portal.services.booking.quotas import (
    DEFAULT_BUDGET_PERIOD_DAYS,
    devices_held_now,
    usage_current,
)
from portal.services.fleet import nodes as node_services
from portal.services.fleet import sharing as gpu_sharing


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]
    readonly_fields = ["granted_by_rule"]


@admin.register(GroupMappingRule)
class GroupMappingRuleAdmin(admin.ModelAdmin):
    """Which identity-provider groups give which project memberships, applied at each sign-in."""

    list_display = ["group", "source", "project", "role"]
    list_filter = ["source", "role", "project"]
    list_editable = ["role"]
    list_display_links = ["group"]
    search_fields = ["group", "project__slug"]
    autocomplete_fields = ["project"]


class QuotaInline(admin.StackedInline):
    model = Quota
    form = QuotaForm
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(AuditedAdminMixin):
    list_display = ["slug", "name", "member_count"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline, QuotaInline]
    audit_cascade = ("memberships", "quotas")

    @admin.display(description="members")
    def member_count(self, obj) -> int:
        return obj.memberships.count()


@admin.register(Quota)
class QuotaAdmin(AuditedAdminMixin):
    list_display = [
        "project",
        "user",
        "gpus_limit_and_use",
        "hours_limit_and_use",
        "longest_booking",
        "fairshare_shares",
        "borrowing",
    ]
    form = QuotaForm
    list_filter = ["project"]
    list_select_related = ["project", "user"]
    autocomplete_fields = ["project", "user"]
    search_fields = ["project__slug", "user__username"]

    def _usage(self, obj):
        # Kept on the row (one request's object), not on this admin, which all requests share.
        if not hasattr(obj, "_usage"):
            period = obj.budget_period_days or DEFAULT_BUDGET_PERIOD_DAYS
            now = timezone.now()
            obj._usage = usage_current(
                project=obj.project, user=obj.user, now=now, period_days=period
            )
            obj._held = devices_held_now(project=obj.project, user=obj.user, now=now)
        return obj._usage

    @admin.display(description="GPUs in use, of the limit")
    def gpus_limit_and_use(self, obj) -> str:
        usage = self._usage(obj)
        return gpus_held_text(*obj._held, usage.gpus_in_use, obj.max_gpus)

    @admin.display(description="GPU-hours used, of the budget")
    def hours_limit_and_use(self, obj) -> str:
        return hours_used_text(self._usage(obj).gpu_hours_used, obj.gpu_hours_budget)

    @admin.display(description="longest booking", ordering="max_duration_s")
    def longest_booking(self, obj) -> str:
        return duration_text(obj.max_duration_s)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "model", "memory_mib", "mig_mode"]


@admin.register(Node)
class NodeAdmin(AuditedAdminMixin):
    list_display = [
        "hostname",
        "state",
        "state_reason",
        "network_group",
        "last_seen",
        "agent_version",
        "cpus",
        "memory_mib",
    ]
    list_filter = ["state", "network_group"]
    search_fields = ["hostname"]
    exclude = ["agent_token_hash"]
    readonly_fields = ["cpus", "memory_mib"]  # what its agent reports at register
    inlines = [GpuInline]
    actions = ["drain", "undrain"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(last_seen=F("heartbeat__last_seen"))

    @admin.display(description="last seen", ordering="last_seen")
    def last_seen(self, obj):
        return obj.last_seen

    @admin.action(description="Drain: finish running work, place nothing new")
    def drain(self, request, queryset):
        changed = node_services.node_drain(
            node_ids=queryset.values_list("pk", flat=True),
            actor=request.user,
            source=source_of(request, Via.ADMIN),
        )
        self.message_user(request, f"{changed} node(s) drained.")

    @admin.action(description="Return to service")
    def undrain(self, request, queryset):
        changed = node_services.node_return_to_service(
            node_ids=queryset.values_list("pk", flat=True),
            actor=request.user,
            source=source_of(request, Via.ADMIN),
        )
        self.message_user(request, f"{changed} node(s) returned to service.")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "model", "memory_mib", "mig_mode", "sharing", "uuid"]
    list_filter = ["model", "mig_mode", "sharing", "node"]
    search_fields = ["uuid", "node__hostname"]
    list_select_related = ["node"]
    # What its agent reports at each register: a change here would not last. The sharing mode
    # changes only by the actions, which refuse a GPU under live bookings of the other kind.
    readonly_fields = ["pci_bus_id", "numa_node", "nvlink_peers", "sharing"]
    actions = ["make_shared", "make_exclusive"]

    @admin.action(description="Share: fractions to several bookings")
    def make_shared(self, request, queryset):
        self._sharing(request, queryset, Gpu.Sharing.SHARED)

    @admin.action(description="Make exclusive: whole (or MIG slices) to one booking")
    def make_exclusive(self, request, queryset):
        self._sharing(request, queryset, Gpu.Sharing.EXCLUSIVE)

    def _sharing(self, request, queryset, sharing: str) -> None:
        changed = 0
        for gpu_id in queryset.order_by("pk").values_list("pk", flat=True):
            try:
                changed += (
                    gpu_sharing.gpu_set_sharing(
                        actor=request.user,
                        gpu_id=gpu_id,
                        sharing=sharing,
                        now=timezone.now(),
                        source=source_of(request, Via.ADMIN),
                    ).sharing
                    == sharing
                )
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.ERROR)
        self.message_user(request, f"{changed} GPU(s) now {sharing}.")


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
    """Every user's API tokens (keys are never stored); revoking one is audited."""

    list_display = ["prefix", "user", "name", "scope", "created", "expires_at", "last_used"]
    list_filter = ["scope"]
    search_fields = ["user__username", "name", "prefix"]
    list_select_related = ["user"]
    exclude = ["key_hash"]
    readonly_fields = [
        "user",
        "name",
        "prefix",
        "scope",
        "created",
        "expires_at",
        "last_used",
        "created_by",
    ]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # a key is shown once, to its owner: tokens are made on the Tokens page

    def has_change_permission(self, request, obj=None):
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # revoke, which audits, instead
        return actions

    def delete_model(self, request, obj):
        self._revoke(request, [obj.pk])

    @admin.action(description="Revoke the selected tokens", permissions=["delete"])
    def revoke(self, request, queryset):
        count = self._revoke(request, list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{count} token(s) revoked.", messages.SUCCESS)

    def _revoke(self, request, token_ids: list[int]) -> int:
        source = source_of(request, Via.ADMIN)
        for token_id in token_ids:
            token_services.token_revoke(actor=request.user, token_id=token_id, source=source)
        return len(token_ids)


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """The audit log, append only: nobody adds, changes or deletes rows here."""

    list_display = ["at", "actor_name", "address", "via", "action", "target", "project_slug"]
    list_filter = ["action", "via", ("actor", admin.RelatedOnlyFieldListFilter), "project"]
    date_hierarchy = "at"
    search_fields = ["actor_name", "action", "target_id", "project_slug", "address"]
    ordering = ["-at", "-id"]
    actions = ["export_csv"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="target")
    def target(self, obj) -> str:
        return f"{obj.target_type} {obj.target_id}".strip()

    @admin.action(description="Export the selected events as CSV", permissions=["view"])
    def export_csv(self, request, queryset):
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="gpu-portal-audit.csv"'
        writer = csv_dict_writer(response, CSV_COLUMNS)
        for event in queryset.order_by("-at", "-id").iterator():
            writer.writerow(audit_row(event, text=True))
        return response


@admin.register(NodeAlert)
class NodeAlertAdmin(admin.ModelAdmin):
    """Processes the node agents objected to (foreign or on unbooked devices); read-only."""

    list_display = [
        "last_seen",
        "time",
        "count",
        "node",
        "kind",
        "device_uuid",
        "pid",
        "user",
        "action",
        "booking",
    ]
    list_filter = ["kind", "action", "node"]
    search_fields = ["node__hostname", "device_uuid", "user", "detail"]
    raw_id_fields = ["booking", "owner"]
    ordering = ["-last_seen", "-id"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class _Undispatched(admin.SimpleListFilter):
    title = "dispatch"
    parameter_name = "dispatch"

    def lookups(self, request, model_admin):
        return [("waiting", "Not dispatched yet"), ("failed", "Failed at least once")]

    def queryset(self, request, queryset):
        if self.value() == "waiting":
            return queryset.filter(dispatched_at=None)
        if self.value() == "failed":
            return queryset.exclude(last_error="")
        return queryset


@admin.register(DomainEvent)
class DomainEventAdmin(admin.ModelAdmin):
    """The outbox's facts: what was dispatched, what is still waiting or was given up; read-only."""

    list_display = [
        "id",
        "kind",
        "booking_id",
        "node_id",
        "created_at",
        "dispatched_at",
        "attempts",
    ]
    list_filter = [_Undispatched, "kind"]
    search_fields = ["last_error"]
    ordering = ["-id"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


# Notifications (deliveries, idle reclaims, project channels), maintenance windows (made
# through their services, like the API's), MIG layout changes and project reservations: kept
# beside, not in, this module.
from portal import (  # noqa: E402,F401
    admin_maintenance,
    admin_mig,
    admin_notifications,
    admin_reservations,
)
