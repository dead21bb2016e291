"""Admin for notifications: every send (filter by status, channel, event), idle reclaims, a
project's channel and idle policy. Registered from portal.admin."""

from django.contrib import admin

from portal.models import Delivery, IdleReclaim, ProjectNotificationSettings


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = (
        "created",
        "event",
        "channel",
        "recipient",
        "status",
        "attempts",
        "sent_at",
        "last_error",
    )
    list_filter = ("status", "channel", "event")
    search_fields = ("recipient", "idempotency_key", "notification__booking__id")
    date_hierarchy = "created"
    readonly_fields = [f.name for f in Delivery._meta.fields]
    ordering = ("-created", "-id")

    def has_add_permission(self, request):
        return False


@admin.register(IdleReclaim)
class IdleReclaimAdmin(admin.ModelAdmin):
    list_display = ("booking", "state", "warned_at", "closed_at", "detail")
    list_filter = ("state",)
    readonly_fields = ("booking", "state", "warned_at", "closed_at", "detail")
    ordering = ("-warned_at", "-id")

    def has_add_permission(self, request):
        return False


@admin.register(ProjectNotificationSettings)
class ProjectNotificationSettingsAdmin(admin.ModelAdmin):
    list_display = ("project", "slack_channel", "webhook_url", "idle_util_threshold")
    autocomplete_fields = ()
