"""Admin of project reservations: the form validates through the same spec as the API
(portal.services.booking.project_reservations), and every save or delete re-plans the queue."""

from django import forms
from django.contrib import admin
from django.db import transaction
from django.utils import timezone

from portal.errors import ValidationFailed
from portal.models import ProjectReservation
from portal.services.booking import project_reservations as service


class ProjectReservationForm(forms.ModelForm):
    class Meta:
        model = ProjectReservation
        fields = [
            "project",
            "gpus",
            "gpu_model",
            "nodes",
            "start",
            "end",
            "weekly",
            "idle_release_minutes",
            "note",
        ]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            service.reservation_spec(
                project=data["project"].slug,
                gpus=data.get("gpus"),
                gpu_model=data.get("gpu_model") or "",
                nodes=[n.hostname for n in data.get("nodes") or ()],
                start=data["start"],
                end=data["end"],
                weekly=data.get("weekly", False),
                idle_release_minutes=data.get("idle_release_minutes"),
                now=timezone.now(),
            )
        except ValidationFailed as exc:
            for name, reason in exc.fields.items():
                self.add_error(name if name in self.fields else None, reason)
        return data


@admin.register(ProjectReservation)
class ProjectReservationAdmin(admin.ModelAdmin):
    """Capacity set aside for a project, once or weekly."""

    form = ProjectReservationForm
    list_display = [
        "project",
        "gpus",
        "gpu_model",
        "start",
        "end",
        "weekly",
        "idle_release_minutes",
    ]
    list_filter = ["weekly", "project"]
    list_select_related = ["project"]
    autocomplete_fields = ["project"]
    filter_horizontal = ["nodes"]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        with transaction.atomic():
            super().save_related(request, form, formsets, change)
            service.reservation_changed(
                reservation_id=form.instance.pk, change="changed" if change else "created"
            )

    def delete_model(self, request, obj):
        service.reservation_delete(reservation=obj)

    def delete_queryset(self, request, queryset):
        for reservation in queryset.order_by("id"):
            service.reservation_delete(reservation=reservation)
