"""Admins edit quotas and see usage beside limits; owners hear about queue events after commit
(the channels themselves: tests/notifications/)."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from tests.factories import AllocationFactory, BookingFactory, make_node

pytestmark = pytest.mark.django_db


def test_it_lists_quotas_with_usage_beside_each_limit(admin_client, user, project):
    project.quotas.update(max_gpus=8, gpu_hours_budget=100)
    gpu = make_node("n1", gpus=1).gpus.get()
    now = timezone.now()
    booking = BookingFactory(owner=user, project=project, state="active")
    AllocationFactory(
        booking=booking, gpu=gpu, start=now - timedelta(hours=3), end=now + timedelta(hours=1)
    )
    html = admin_client.get("/admin/portal/quota/").content.decode()
    assert "GPUs in use / limit" in html
    assert "1 / 8" in html
    assert "3.0 / 100" in html


def test_it_lets_an_admin_override_a_users_quota(admin_client, user, project):
    response = admin_client.post(
        "/admin/portal/quota/add/",
        {
            "project": project.pk,
            "user": user.pk,
            "max_gpus": "2",
            "allowed_models": "",
            "allowed_qos": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert project.quotas.get(user=user).max_gpus == 2


def test_it_refuses_a_malformed_model_list_in_the_admin(admin_client, user, project):
    response = admin_client.post(
        "/admin/portal/quota/add/",
        {
            "project": project.pk,
            "user": user.pk,
            "allowed_models": '"A100"',
            "allowed_qos": "",
        },
    )
    assert response.status_code == 200
    assert "Enter a list of names" in response.content.decode()
    assert not project.quotas.filter(user=user).exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("address", "10.9.9.9 --nproc-per-node=999"), ("hostname", "evil slots=99")],
)
def test_it_refuses_a_node_name_or_address_that_is_no_host_in_the_admin(
    admin_client, cluster, field, value
):
    node = cluster[0]
    data = {
        "hostname": node.hostname,
        "state": node.state,
        "address": "10.0.0.1",
        "gpus-TOTAL_FORMS": "0",
        "gpus-INITIAL_FORMS": "0",
        "gpus-MIN_NUM_FORMS": "0",
        "gpus-MAX_NUM_FORMS": "1000",
    }
    response = admin_client.post(f"/admin/portal/node/{node.pk}/change/", {**data, field: value})
    assert response.status_code == 200
    assert "must be" in response.content.decode()
    node.refresh_from_db()
    assert getattr(node, field) != value
    assert admin_client.post(f"/admin/portal/node/{node.pk}/change/", data).status_code == 302


def test_it_refuses_a_second_project_row(admin_client, project):
    response = admin_client.post(
        "/admin/portal/quota/add/", {"project": project.pk, "allowed_models": "", "allowed_qos": ""}
    )
    assert response.status_code == 200
    assert project.quotas.count() == 1


def test_it_sends_notifications_only_after_commit(
    api, user, project, cluster, django_capture_on_commit_callbacks
):
    start = timezone.now() + timedelta(hours=1)
    body = {"gpus": 1, "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert api.post("/api/v1/bookings/", body, format="json").status_code == 201
    assert mail.outbox == [] and callbacks
    with django_capture_on_commit_callbacks(execute=True):  # and the callbacks those queue
        for callback in callbacks:
            callback()
    assert [m.subject.split(" from ")[0] for m in mail.outbox] == [
        f"Booking {user.bookings.get().pk} reserved"
    ]
