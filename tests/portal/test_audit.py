"""The audit log: one row with before and after for every booking command, quota, membership,
node and token change and every login; append only; read by admins and project managers."""

import csv
import io
from datetime import timedelta

import pytest
from django.db import DatabaseError, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import AuditEvent, Booking, Membership, Node
from portal.models.audit import AppendOnlyError
from portal.services.access.audit import ACTIONS, audit_record
from portal.services.allocation.allocation import allocation_pass
from portal.services.booking.bookings import booking_stop
from tests.conftest import error_of
from tests.factories import ProjectFactory, UserFactory, make_active_booking, member

pytestmark = pytest.mark.django_db


def _only(action: str) -> AuditEvent:
    rows = list(AuditEvent.objects.filter(action=action))
    assert len(rows) == 1, [(r.action, r.target_id) for r in rows]
    return rows[0]


def _reserve(api, **body):
    start = timezone.now() + timedelta(days=1)
    body = {"gpus": 1, "start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()}
    response = api.post("/api/v1/bookings/", body, format="json", REMOTE_ADDR="10.1.2.3")
    assert response.status_code == 201, response.json()
    return response.json()


def test_it_records_each_booking_command_once_with_who_where_and_the_change(
    api, user, project, cluster
):
    booking = _reserve(api)
    submit = _only("booking.submit")
    assert (submit.actor_id, submit.actor_name, submit.via) == (user.pk, "alice", "api")
    assert submit.address == "10.1.2.3"
    assert (submit.target_type, submit.target_id) == ("booking", str(booking["id"]))
    assert submit.project_id == project.pk and submit.project_slug == "vision"
    assert submit.before is None and submit.after["state"] == "planned"

    api.post(f"/api/v1/bookings/{booking['id']}/extend/", {"by_s": 1800}, format="json")
    extend = _only("booking.extend")
    assert extend.before["duration_s"] == 7200 and extend.after["duration_s"] == 9000
    assert "state" not in extend.after  # only what changed

    api.post(f"/api/v1/bookings/{booking['id']}/cancel/")
    cancel = _only("booking.cancel")
    assert cancel.before["state"] == "planned"
    assert cancel.after["state"] == "cancelled"


def test_it_records_a_release_made_on_the_web_page(client, user, project, cluster):
    booking = make_active_booking([cluster[0].gpus.first()], owner=user, project=project)
    client.force_login(user)
    response = client.post(f"/bookings/{booking.pk}/release/", REMOTE_ADDR="192.0.2.9")
    assert response.status_code == 302
    release = _only("booking.release")
    assert (release.via, release.address, release.actor_id) == ("web", "192.0.2.9", user.pk)
    assert release.before["state"] == "active" and release.after["state"] == "finished"


def test_it_writes_no_row_for_a_refused_command(api, project, cluster):
    booking = _reserve(api)
    api.post(f"/api/v1/bookings/{booking['id']}/cancel/")
    assert api.post(f"/api/v1/bookings/{booking['id']}/cancel/").status_code == 409
    assert AuditEvent.objects.filter(action="booking.cancel").count() == 1


def test_it_records_a_preemption_by_the_allocation_pass_as_the_system(
    api, user, project, cluster, settings, django_capture_on_commit_callbacks
):
    project.quotas.update(max_gpus=None, allowed_qos=None)
    settings.SCHEDULER_POLICY = {**settings.SCHEDULER_POLICY, "preempt_grace_s": 300}
    with django_capture_on_commit_callbacks(execute=True):
        batch = api.post(
            "/api/v1/bookings/",
            {"gpus": 16, "duration_s": 86400, "qos": "low", "preemptible": True, "command": "x"},
            format="json",
        ).json()
    with django_capture_on_commit_callbacks(execute=True):
        api.post("/api/v1/bookings/", {"gpus": 8, "duration_s": 3600, "qos": "high"}, format="json")
    allocation_pass(now=timezone.now() + timedelta(seconds=301))
    preempt = _only("booking.preempt")
    assert preempt.target_id == str(batch["id"])
    assert (preempt.actor_id, preempt.via) == (None, "system")
    assert preempt.before["state"] == "active" and preempt.after["state"] == "pending"
    assert "requeued" in preempt.after["state_detail"]


def test_it_records_a_node_failure_requeue_and_a_plain_failure(project, cluster):
    gpus = list(cluster[0].gpus.all())
    batch = make_active_booking([gpus[0]], project=project, command="python train.py")
    window = make_active_booking([gpus[1]], project=project)
    now = timezone.now()
    booking_stop(booking_id=batch.pk, to=Booking.State.FAILED, now=now, detail="node down")
    booking_stop(booking_id=window.pk, to=Booking.State.FAILED, now=now, detail="node down")
    assert _only("booking.requeue").after["state"] == "pending"
    assert _only("booking.fail").after["state"] == "failed"


def test_it_refuses_to_change_or_delete_an_audit_row(db):
    event = audit_record(action="login", after={"x": 1})
    event.after = {"x": 2}
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.delete()
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(after={"x": 3})
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()
    assert AuditEvent.objects.get(pk=event.pk).after == {"x": 1}


def test_it_refuses_an_action_it_does_not_know(db):
    with pytest.raises(ValueError):
        audit_record(action="booking.teleport")
    assert "booking.reclaim" in ACTIONS  # idle reclaim records through audit_record too


def test_it_keeps_the_history_of_a_deleted_user(client, db):
    gone = UserFactory(username="gone")
    client.post("/accounts/login/", {"username": "gone", "password": "pw-secret-123"})
    pk = gone.pk
    gone.delete()
    login = _only("login")
    assert (login.actor_name, login.actor_id) == ("gone", pk)


def test_it_records_logins_and_failed_logins_with_the_address(client, db):
    UserFactory(username="bob")
    client.post(
        "/accounts/login/", {"username": "bob", "password": "wrong"}, REMOTE_ADDR="198.51.100.7"
    )
    failed = _only("login.failed")
    assert (failed.actor_id, failed.actor_name, failed.address) == (None, "bob", "198.51.100.7")
    response = client.post("/accounts/login/", {"username": "bob", "password": "pw-secret-123"})
    assert response.status_code == 302
    login = _only("login")
    assert login.actor_name == "bob" and login.via == "web"


def test_it_takes_the_address_from_x_forwarded_for_only_behind_a_trusted_proxy(
    client, settings, db
):
    UserFactory(username="bob")
    creds = {"username": "bob", "password": "wrong"}
    client.post("/accounts/login/", creds, REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6")
    settings.TRUSTED_PROXY_COUNT = 1
    client.post("/accounts/login/", creds, REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="7.7.7.7")
    addresses = list(
        AuditEvent.objects.filter(action="login.failed")
        .order_by("id")
        .values_list("address", flat=True)
    )
    assert addresses == ["10.0.0.1", "7.7.7.7"]


def test_it_records_an_admins_quota_edit_with_before_and_after(admin_client, project):
    quota = project.quotas.get()
    response = admin_client.post(
        f"/admin/portal/quota/{quota.pk}/change/",
        {"project": project.pk, "max_gpus": "4", "allowed_models": "", "allowed_qos": ""},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    change = _only("quota.change")
    assert (change.before, change.after) == ({"max_gpus": 16.0}, {"max_gpus": 4.0})
    assert change.via == "admin" and change.actor_name == "root" and change.project_id == project.pk


def test_it_records_a_membership_change_made_inline_on_the_project(admin_client, user, project):
    membership = project.memberships.get()
    quota = project.quotas.get()
    data = {
        "slug": project.slug,
        "name": project.name,
        "description": "",
        "memberships-TOTAL_FORMS": "1",
        "memberships-INITIAL_FORMS": "1",
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
        "memberships-0-id": membership.pk,
        "memberships-0-project": project.pk,
        "memberships-0-user": user.pk,
        "memberships-0-role": "manager",
        "quotas-TOTAL_FORMS": "1",
        "quotas-INITIAL_FORMS": "1",
        "quotas-MIN_NUM_FORMS": "0",
        "quotas-MAX_NUM_FORMS": "1000",
        "quotas-0-id": quota.pk,
        "quotas-0-project": project.pk,
        "quotas-0-max_gpus": "16",
        "quotas-0-allowed_models": "",
        "quotas-0-allowed_qos": "",
    }
    response = admin_client.post(f"/admin/portal/project/{project.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    change = _only("membership.change")
    assert (change.before, change.after) == ({"role": "member"}, {"role": "manager"})
    assert change.project_slug == "vision"
    assert not AuditEvent.objects.filter(action="quota.change").exists()  # unchanged: no row


def test_it_records_a_quota_deleted_in_the_admin(admin_client, project):
    quota = project.quotas.get()
    response = admin_client.post(f"/admin/portal/quota/{quota.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    deleted = _only("quota.delete")
    assert deleted.target_id == str(quota.pk) and deleted.after is None
    assert deleted.before["max_gpus"] == 16.0


def test_it_records_drain_and_return_to_service(admin_client, cluster):
    node = cluster[0]
    for action in ("drain", "undrain"):
        response = admin_client.post(
            "/admin/portal/node/", {"action": action, "_selected_action": [node.pk]}
        )
        assert response.status_code == 302
    drain, back = _only("node.drain"), _only("node.return")
    assert drain.before["state"] == "up" and drain.after["state"] == "drain"
    assert back.before["state"] == "drain" and back.after["state"] == "up"
    assert drain.actor_name == "root" and drain.target_id == str(node.pk)
    assert Node.objects.get(pk=node.pk).state == "up"


def test_it_lets_staff_read_and_export_everything_with_filters(admin_client, api, project, cluster):
    _reserve(api)
    audit_record(action="login", actor_name="x")
    body = admin_client.get("/api/v1/audit/", {"action": "booking."}).json()
    assert [r["action"] for r in body["results"]] == ["booking.submit"]
    assert body["results"][0]["after"]["state"] == "planned"
    response = admin_client.get("/api/v1/audit/", {"format": "csv", "project": "vision"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["action"], r["actor"], r["project"]) for r in rows] == [
        ("booking.submit", "alice", "vision")
    ]
    assert '"state": "planned"' in rows[0]["after"]


def test_it_shows_a_manager_only_their_projects_events_and_a_member_none(
    api, user, project, cluster
):
    _reserve(api)
    other = UserFactory(username="dave")
    elsewhere = member(other, ProjectFactory(slug="nlp"))
    audit_record(action="quota.change", project=elsewhere.project)
    assert error_of(api.get("/api/v1/audit/"))["code"] == "forbidden"
    manager = UserFactory(username="carol")
    member(manager, project, Membership.Role.MANAGER)
    api.force_authenticate(manager)
    body = api.get("/api/v1/audit/").json()
    assert [r["project"] for r in body["results"]] == ["vision"]


def test_it_exports_the_selection_as_csv_from_the_admin(admin_client, api, project, cluster):
    _reserve(api)
    event = _only("booking.submit")
    response = admin_client.post(
        "/admin/portal/auditevent/", {"action": "export_csv", "_selected_action": [event.pk]}
    )
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["action"] for r in rows] == ["booking.submit"]
    page = admin_client.get("/admin/portal/auditevent/", {"action__exact": "booking.submit"})
    assert page.status_code == 200 and "booking.submit" in page.content.decode()
    assert admin_client.get(f"/admin/portal/auditevent/{event.pk}/delete/").status_code == 403


def test_it_records_an_api_token_exchange_as_a_login(db):
    UserFactory(username="erin")
    response = APIClient().post(
        "/api/v1/auth/token/", {"username": "erin", "password": "pw-secret-123"}, format="json"
    )
    assert response.status_code == 201
    assert _only("login").via == "api"
    assert _only("token.create").actor_name == "erin"


def test_it_records_the_memberships_and_quotas_a_project_delete_removes(admin_client, project):
    response = admin_client.post(f"/admin/portal/project/{project.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert _only("membership.delete").before["role"] == "member"
    assert _only("quota.delete").project_slug == "vision"


def test_it_records_a_failed_admin_login_as_via_admin(client, db):
    client.post("/admin/login/", {"username": "nobody", "password": "x"})
    failed = _only("login.failed")
    assert (failed.via, failed.actor_name) == ("admin", "nobody")


def test_it_records_an_admins_node_edit_without_its_agent_token(admin_client, cluster):
    node = cluster[0]
    data = {
        "hostname": node.hostname,
        "state": "down",
        "state_reason": "maintenance",
        "agent_version": "",
        "gpus-TOTAL_FORMS": "0",
        "gpus-INITIAL_FORMS": "0",
        "gpus-MIN_NUM_FORMS": "0",
        "gpus-MAX_NUM_FORMS": "1000",
    }
    response = admin_client.post(f"/admin/portal/node/{node.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    change = _only("node.change")
    assert change.before["state"] == "up" and change.after["state"] == "down"
    assert change.after["state_reason"] == "maintenance"
    assert "agent_token_hash" not in change.before


FORMULA = '=HYPERLINK("http://evil.example/api","x")'


def test_it_neutralises_a_formula_username_in_the_api_csv_export(admin_client, client, db):
    client.post("/accounts/login/", {"username": FORMULA, "password": "x"})
    response = admin_client.get("/api/v1/audit/", {"format": "csv", "action": "login.failed"})
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["actor"] for r in rows] == ["'" + FORMULA]


def test_it_neutralises_a_formula_username_in_the_admin_csv_export(admin_client, client, db):
    client.post("/accounts/login/", {"username": FORMULA, "password": "x"})
    event = _only("login.failed")
    response = admin_client.post(
        "/admin/portal/auditevent/", {"action": "export_csv", "_selected_action": [event.pk]}
    )
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["actor"] for r in rows] == ["'" + FORMULA]
