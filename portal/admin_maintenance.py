"""Maintenance windows in the admin: made, changed and deleted through the services, so the
admin and the API refuse the same windows, re-plan the same way and tell the same people."""

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from portal.errors import ValidationFailed
from portal.models import MaintenanceWindow
from portal.services.access.audit import Via, source_of
from portal.services.fleet import maintenance
from portal.services.inventory.windows import window_nodes


def _spec(data: dict) -> maintenance.WindowSpec:
    return maintenance.WindowSpec(
        nodes=tuple(node.hostname for node in data.get("nodes") or ()),
        network_group=data.get("network_group") or "",
        start=data["start"],
        end=data["end"],
        reason=data.get("reason") or "",
    )


class MaintenanceWindowForm(forms.ModelForm):
    class Meta:
        model = MaintenanceWindow
        fields = ["reason", "start", "end", "nodes", "network_group"]
        help_texts = {"nodes": "None picked and no network group: every node."}

    def clean(self):
        data = super().clean()
        if self.errors or "start" not in data or "end" not in data:
            return data
        try:
            maintenance.window_validate(_spec(data), timezone.now())
        except ValidationFailed as exc:
            raise forms.ValidationError(
                {name: reason for name, reason in exc.fields.items() if name in self.fields}
                or exc.message
            ) from exc
        return data


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(admin.ModelAdmin):
    form = MaintenanceWindowForm
    list_display = ["id", "reason", "start", "end", "covers", "network_group", "created_by"]
    list_filter = ["network_group"]
    ordering = ["-start", "-id"]
    filter_horizontal = ["nodes"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("nodes")

    @admin.display(description="nodes")
    def covers(self, obj) -> str:
        if not obj.network_group and not obj.nodes.all():
            return "every node"
        return ", ".join(node.hostname for node in window_nodes(obj))

    def save_model(self, request, obj, form, change):
        spec, source = _spec(form.cleaned_data), source_of(request, Via.ADMIN)
        if change:
            changes = {**spec.__dict__, "nodes": list(spec.nodes)}
            window, collisions = maintenance.maintenance_update(
                actor=request.user,
                window_id=obj.pk,
                changes=changes,
                now=timezone.now(),
                source=source,
            )
        else:
            window, collisions = maintenance.maintenance_create(
                actor=request.user, spec=spec, now=timezone.now(), source=source
            )
        obj.pk = window.pk
        self.message_user(request, _collisions_text(collisions), messages.WARNING)

    def save_related(self, request, form, formsets, change):
        pass  # the service set the nodes

    def delete_model(self, request, obj):
        maintenance.maintenance_delete(
            actor=request.user, window_id=obj.pk, source=source_of(request, Via.ADMIN)
        )

    def delete_queryset(self, request, queryset):
        for window in queryset.order_by("pk"):
            self.delete_model(request, window)


def _collisions_text(collisions) -> str:
    if not collisions:
        return "No running or planned booking collides with this window."
    listed = ", ".join(
        f"{b.pk} ({b.owner.username}, {b.get_state_display().lower()})" for b in collisions
    )
    return (
        f"{len(collisions)} booking(s) on these nodes collide with the window and are not "
        f"ended by it; their owners are told: {listed}."
    )
