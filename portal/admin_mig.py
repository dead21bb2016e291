"""MIG layout changes in /admin/: staff ask for a new layout of a GPU (validated by the same
service as the API), see how each change goes, and approve or cancel them."""

import json

from django import forms
from django.contrib import admin, messages

from portal.errors import ApplicationError
from portal.models import Gpu, MigLayoutChange
from portal.services.access.audit import Via, source_of
from portal.services.allocation import mig_changes
from portal.services.inventory import mig_layouts


class MigLayoutChangeForm(forms.ModelForm):
    """A GPU in MIG mode and its new layout, as JSON or as profiles joined by "+"
    ("3g.40gb+2g.20gb+1g.10gb"; a profile may name its start: "3g.40gb@4")."""

    instances = forms.CharField(
        help_text="e.g. 4g.40gb+2g.20gb+1g.10gb, 3g.40gb@4+3g.40gb@0, or JSON "
        '[{"profile": "3g.40gb", "start": 4}]. Starts left out are chosen.'
    )

    class Meta:
        model = MigLayoutChange
        fields = ["gpu"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "gpu" not in self.fields:
            return  # a change's own page: read-only
        self.fields["gpu"].queryset = Gpu.objects.filter(
            retired_at__isnull=True, mig_mode=True
        ).select_related("node")

    def clean_instances(self):
        return instances_parse(self.cleaned_data["instances"])

    def clean(self):
        cleaned = super().clean()
        gpu, instances = cleaned.get("gpu"), cleaned.get("instances")
        if gpu is not None and instances is not None:
            try:
                mig_layouts.mig_layout_check(gpu=gpu, instances=instances)
            except ApplicationError as exc:
                raise forms.ValidationError(exc.message) from None
            if MigLayoutChange.objects.filter(gpu=gpu, state__in=MigLayoutChange.OPEN).exists():
                raise forms.ValidationError(f"{gpu} has a MIG layout change under way.")
        return cleaned


def instances_parse(text: str) -> list:
    """The admin form's layout text as the API's instances list."""
    text = text.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except ValueError:
            raise forms.ValidationError("Not valid JSON.") from None
    items = []
    for part in text.split("+")[:9]:  # more than 8 is refused by the service anyway
        profile, at, start = part.strip().partition("@")
        if at and not (start.isascii() and start.isdigit()):
            raise forms.ValidationError(f"{part!r}: a start is a whole number, e.g. 3g.40gb@4")
        items.append({"profile": profile, "start": int(start) if at else None})
    return items


@admin.register(MigLayoutChange)
class MigLayoutChangeAdmin(admin.ModelAdmin):
    form = MigLayoutChangeForm
    list_display = ["id", "gpu", "layout_text", "state", "planned_at", "detail", "created"]
    list_filter = ["state"]
    actions = ["approve", "cancel"]
    readonly_fields = [
        "state",
        "layout",
        "previous",
        "planned_at",
        "detail",
        "requested_by",
        "applying_since",
        "finished_at",
    ]

    @admin.display(description="Layout")
    def layout_text(self, obj) -> str:
        return " + ".join(f"{i['profile']}@{i['start']}" for i in obj.layout)

    def has_change_permission(self, request, obj=None):
        return False  # a change is asked for once; then approve or cancel it

    def get_fields(self, request, obj=None):
        return ["gpu", "instances"] if obj is None else ["gpu", *self.readonly_fields]

    def save_model(self, request, obj, form, change):
        # The service writes the row (state, audit, fact); the admin does not save the form's.
        # (A race the form's checks lost, another change begun meanwhile, is the service's 409.)
        created = mig_changes.mig_layout_request(
            gpu_id=form.cleaned_data["gpu"].pk,
            instances=form.cleaned_data["instances"],
            by=request.user,
            source=source_of(request, Via.ADMIN),
        )
        for field in MigLayoutChange._meta.concrete_fields:
            setattr(obj, field.attname, getattr(created, field.attname))

    @admin.action(description="Approve the selected proposed changes")
    def approve(self, request, queryset):
        self._each(request, queryset, mig_changes.mig_layout_approve, "approved")

    @admin.action(description="Cancel the selected changes (not yet applying)")
    def cancel(self, request, queryset):
        self._each(request, queryset, mig_changes.mig_layout_cancel, "cancelled")

    def _each(self, request, queryset, service, done: str) -> None:
        moved = 0
        for pk in queryset.order_by("pk").values_list("pk", flat=True):
            try:
                service(change_id=pk, by=request.user)
                moved += 1
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.WARNING)
        self.message_user(request, f"{moved} change(s) {done}.")
