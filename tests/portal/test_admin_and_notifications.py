"""Admins edit quotas and see usage beside limits; owners hear about queue events after commit
(the channels themselves: tests/notifications/)."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from tests.factories import AllocationFactory, BookingFactory, make_mig_gpu, make_node

pytestmark = pytest.mark.django_db


def test_it_lists_quotas_with_usage_beside_each_limit(admin_client, user, project):
    project.quotas.update(max_gpus=8, gpu_hours_budget=100, max_duration_s=3 * 86400)
    gpu = make_node("n1", gpus=1).gpus.get()
    now = timezone.now()
    booking = BookingFactory(owner=user, project=project, state="active")
    AllocationFactory(
        booking=booking, gpu=gpu, start=now - timedelta(hours=3), end=now + timedelta(hours=1)
    )
    html = admin_client.get("/admin/portal/quota/").content.decode()
    assert "GPUs in use, of the limit" in html
    assert "1 GPU of 8" in html
    assert "3.0 of 100 GPU-hours" in html
    assert '<td class="field-longest_booking">3 d</td>' in html


def test_it_lists_gpus_and_mig_slices_as_people_count_them(admin_client, user, project):
    # 4 whole GPUs and 3 one-slice MIG instances: 4 + 3/7 = 4.43 GPU-equivalents.
    project.quotas.update(max_gpus=16, max_duration_s=None)
    node = make_node("n1", gpus=4)
    mig = make_mig_gpu(node, 4, profiles=("1g.10gb",) * 7)
    now = timezone.now()
    booking = BookingFactory(owner=user, project=project, state="active")
    window = {"start": now - timedelta(hours=1), "end": now + timedelta(hours=1)}
    for gpu in node.gpus.filter(mig_mode=False):
        AllocationFactory(booking=booking, gpu=gpu, **window)
    for instance in mig.mig_instances.all()[:3]:
        AllocationFactory(
            booking=booking, gpu=mig, mig_instance=instance, fraction=instance.fraction, **window
        )
    html = admin_client.get("/admin/portal/quota/").content.decode()
    assert "4 GPUs + 3 MIG slices, 4.4 GPU-equivalents, of 16" in html
    assert "4.4286" not in html
    assert '<td class="field-longest_booking">site maximum</td>' in html


def test_it_offers_allowed_models_as_a_choice_of_the_sites_models(admin_client, project):
    make_node("n1", model="A100-80GB"), make_node("n2", model="H100-80GB")
    quota = project.quotas.get()
    quota.allowed_models = ["H100-80GB", "A100-80GB"]
    quota.save()
    page = admin_client.get(f"/admin/portal/quota/{quota.pk}/change/").content.decode()
    for model in ("A100-80GB", "H100-80GB"):
        assert f'type="checkbox" name="allowed_models" value="{model}"' in page
    form = {"project": project.pk, "allowed_qos": "", "max_gpus": "16"}
    unchanged = admin_client.post(
        f"/admin/portal/quota/{quota.pk}/change/",
        {**form, "allowed_models": ["A100-80GB", "H100-80GB"]},
    )
    assert unchanged.status_code == 302, unchanged.content.decode()[:2000]
    quota.refresh_from_db()
    assert quota.allowed_models == ["H100-80GB", "A100-80GB"]  # the same stored value
    admin_client.post(
        f"/admin/portal/quota/{quota.pk}/change/", {**form, "allowed_models": ["H100-80GB"]}
    )
    quota.refresh_from_db()
    assert quota.allowed_models == ["H100-80GB"]
    admin_client.post(f"/admin/portal/quota/{quota.pk}/change/", form)
    quota.refresh_from_db()
    assert quota.allowed_models is None  # nothing ticked: all models


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


def test_it_refuses_a_model_the_site_does_not_have_in_the_admin(admin_client, user, project):
    response = admin_client.post(
        "/admin/portal/quota/add/",
        {
            "project": project.pk,
            "user": user.pk,
            "allowed_models": ["A100"],
            "allowed_qos": "",
        },
    )
    assert response.status_code == 200
    assert "Select a valid choice. A100 is not one of the available choices." in (
        response.content.decode()
    )
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
