"""What admins change in /admin/ is written to the audit log, with the values before and after.

A mixin for the ModelAdmins of audited models (quotas, memberships, nodes, and GPUs, which are
part of a node), covering the edit form, inline rows, single and bulk deletes. The admin runs
each form save in one transaction, so the row and its audit entry commit together.
"""

from django.contrib import admin

from portal.models import Gpu, Membership, Node, Quota
from portal.services.access.audit import Via, audit_record, changes, snapshot, source_of

# model -> the name its actions carry in the log ("quota.change", ...)
AUDITED = {Quota: "quota", Membership: "membership", Node: "node", Gpu: "node"}
# Secrets are never copied into the log.
HIDDEN = {"agent_token_hash"}


def _state(obj) -> dict:
    return {k: v for k, v in snapshot(obj).items() if k not in HIDDEN}


def _stored_state(obj) -> dict | None:
    if obj.pk is None:
        return None
    stored = type(obj).objects.filter(pk=obj.pk).first()
    return None if stored is None else _state(stored)


def audit_admin_change(request, obj, before: dict | None, after: dict | None, pk=None) -> None:
    """One audit row for an admin's create, change or delete of an audited object."""
    name = AUDITED.get(type(obj))
    if name is None:
        return
    verb = "create" if before is None else "delete" if after is None else "change"
    project_id = (after or before or {}).get("project_id")
    before, after = changes(before, after)
    if verb == "change" and not after:
        return  # saved without a change
    audit_record(
        action=f"{name}.{verb}",
        actor=request.user,
        source=source_of(request, Via.ADMIN),
        target=obj,
        target_id=pk or obj.pk,
        project=getattr(obj, "project", None),
        project_id=project_id,
        before=before,
        after=after,
    )


class AuditedAdminMixin(admin.ModelAdmin):
    """Saves and deletes here and in this admin's inlines are audited."""

    def save_model(self, request, obj, form, change):
        before = _stored_state(obj)
        super().save_model(request, obj, form, change)
        audit_admin_change(request, obj, before, _state(obj))

    # Related audited rows that a delete here removes with it (a project's memberships, quotas).
    audit_cascade: tuple[str, ...] = ()

    def delete_model(self, request, obj):
        pk, before = obj.pk, _state(obj)
        gone = [
            (o, o.pk, _state(o)) for name in self.audit_cascade for o in getattr(obj, name).all()
        ]
        super().delete_model(request, obj)
        audit_admin_change(request, obj, before, None, pk=pk)
        for related, related_pk, related_before in gone:
            audit_admin_change(request, related, related_before, None, pk=related_pk)

    def delete_queryset(self, request, queryset):
        # One by one, so that each deleted row has its own audit entry.
        for obj in queryset:
            self.delete_model(request, obj)

    def save_formset(self, request, form, formset, change):
        model = formset.model
        stored = {
            o.pk: _state(o)
            for o in model.objects.filter(pk__in=[f.instance.pk for f in formset.forms])
        }
        pks = {id(f.instance): f.instance.pk for f in formset.forms}
        super().save_formset(request, form, formset, change)
        for obj in formset.new_objects:
            audit_admin_change(request, obj, None, _state(obj))
        for obj, _fields in formset.changed_objects:
            audit_admin_change(request, obj, stored.get(obj.pk), _state(obj))
        for obj in formset.deleted_objects:
            pk = pks.get(id(obj))
            audit_admin_change(request, obj, stored.get(pk), None, pk=pk)
