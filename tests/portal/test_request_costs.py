"""The hot endpoints cost a fixed number of queries, however much data; tokens are cached."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.serializers import ModelSerializer
from rest_framework.test import APIClient

from portal.api.serializers import BookingOutput, GpuOutput
from portal.models import ApiToken, Booking, Gpu
from portal.models.tokens import hash_token
from portal.web.overview import summary_forget
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    UserFactory,
    make_active_booking,
    make_agent_node,
    make_mig_gpu,
    make_node,
)
from tests.portal_agent.conftest import AgentClient, reading

pytestmark = pytest.mark.django_db


@pytest.fixture
def token_api(user):
    ApiToken.objects.create(user=user, key_hash=hash_token("gp_costs"), prefix="gp_costs")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Token gp_costs")
    return api


def _queries(call, *args) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = call(*args)
    assert response.status_code < 300, response.content[:300]
    return len(queries)


def _grow(user, project, nodes: int, bookings_per_node: int) -> None:
    """More nodes, MIG GPUs, bookings (live and ended) and allocations."""
    start = Gpu.objects.count()
    for n in range(nodes):
        node = make_node(f"grow-{start}-{n}", gpus=3)
        mig = make_mig_gpu(node, 3)
        gpus = list(node.gpus.filter(mig_mode=False))
        for b in range(bookings_per_node):
            make_active_booking([gpus[b % 3]], owner=user, project=project)
            ended = BookingFactory(owner=user, project=project, state=Booking.State.FINISHED)
            AllocationFactory(
                booking=ended, gpu=mig, mig_instance=mig.mig_instances.first(), live=False
            )


def test_it_lists_bookings_and_gpus_in_queries_that_do_not_grow_with_the_data(
    token_api, user, project
):
    _grow(user, project, nodes=1, bookings_per_node=1)
    token_api.get("/api/v1/gpus/")  # the token is cached from here on
    small = [_queries(token_api.get, p) for p in ("/api/v1/bookings/", "/api/v1/gpus/")]
    _grow(user, project, nodes=4, bookings_per_node=3)
    large = [_queries(token_api.get, p) for p in ("/api/v1/bookings/", "/api/v1/gpus/")]
    assert large == small
    # bookings: managed projects, count, page, devices, node runs (and the cores and memory of
    # the nodes they hold, where nodes report them); gpus: count, page, MIG instances
    assert small[0] <= 5 and small[1] <= 3


def test_it_submits_a_booking_in_queries_that_do_not_grow_with_the_site(token_api, project):
    make_node("a", gpus=2)
    start = timezone.now() + timedelta(days=1)

    def submit(days: int):
        window = {
            "start": start + timedelta(days=days),
            "end": start + timedelta(days=days, hours=1),
        }
        body = {"gpus": 1, **{k: v.isoformat() for k, v in window.items()}}
        return lambda: token_api.post("/api/v1/bookings/", body, format="json")

    submit(0)()
    small = _queries(submit(1))
    for n in range(6):
        make_node(f"more-{n}", gpus=8)
    assert _queries(submit(2)) == small


def test_it_renders_lists_exactly_as_the_output_serializers_do(token_api, user, project):
    _grow(user, project, nodes=2, bookings_per_node=2)
    BookingFactory(owner=user, project=project, priority={"score": 1.5}, exit_code=3)
    listed = token_api.get("/api/v1/bookings/", {"page_size": 100}).json()["results"]
    for row in listed:
        booking = Booking.objects.get(pk=row["id"])
        assert row == BookingOutput(booking).data
        assert row == ModelSerializer.to_representation(BookingOutput(), booking)
    gpus = token_api.get("/api/v1/gpus/", {"page_size": 100}).json()["results"]
    assert any(g["mig_instances"] for g in gpus)
    for row in gpus:
        gpu = Gpu.objects.get(pk=row["id"])
        assert row == GpuOutput(gpu).data
        assert row == ModelSerializer.to_representation(GpuOutput(), gpu)


def test_it_renders_the_overview_and_its_fragments_in_queries_that_do_not_grow(user, project):
    client = Client()
    client.force_login(user)
    _grow(user, project, nodes=1, bookings_per_node=1)
    paths = [
        "/",
        "/?fragment=devices",
        "/?fragment=mine",
        "/?fragment=totals",
        "/?fragment=models",
        "/?fragment=node&node=grow-0-0",
    ]

    def costs() -> tuple[list[int], list[int]]:
        cold = []
        for path in paths:
            summary_forget()  # the summary built afresh
            cold.append(_queries(client.get, path))
        client.get("/")
        warm = []
        for path in paths:
            summary_forget(shared=False)  # from the cache, as another process would read it
            warm.append(_queries(client.get, path))
        return cold, warm

    small = costs()
    _grow(user, project, nodes=4, bookings_per_node=3)
    assert costs() == small
    cold, warm = small
    # The budget before the summary was cached: 17, and one more for the nodes that report
    # cores and memory (the overview's per-node line of them, SCHEDULE_CORES_MEMORY on).
    assert cold[0] <= 18
    assert all(w <= c for w, c in zip(warm, cold, strict=True)) and warm[0] < cold[0]


def test_it_ingests_agent_readings_in_queries_that_do_not_grow_with_the_node():
    small_node, small_token = make_agent_node("small", gpus=1, mig_gpus=1)
    large_node, large_token = make_agent_node("large", gpus=6, mig_gpus=2)

    def ingest(node, token):
        uuids = [g.uuid for g in node.gpus.all()]
        uuids += [m.uuid for g in node.gpus.all() for m in g.mig_instances.all()]
        agent = AgentClient(token)
        return lambda: agent.readings(node.hostname, [reading(u) for u in uuids])

    ingest(small_node, small_token)()
    ingest(large_node, large_token)()
    assert _queries(ingest(large_node, large_token)) == _queries(ingest(small_node, small_token))


def test_it_authenticates_a_cached_token_without_reading_the_token_table(token_api):
    token_api.get("/api/v1/auth/tokens/")
    with CaptureQueriesContext(connection) as queries:
        assert token_api.get("/api/v1/auth/tokens/").status_code == 200
    assert not [q for q in queries if '"portal_apitoken"."key_hash" =' in q["sql"]]


def test_it_refuses_a_revoked_token_at_once_though_it_was_cached(token_api):
    assert token_api.get("/api/v1/bookings/").status_code == 200
    ApiToken.objects.filter(prefix="gp_costs").get().delete()
    assert token_api.get("/api/v1/bookings/").status_code == 401


def test_it_refuses_the_token_of_a_deactivated_user_at_once(token_api, user):
    assert token_api.get("/api/v1/bookings/").status_code == 200
    user.is_active = False
    user.save()
    assert token_api.get("/api/v1/bookings/").status_code == 401


def test_it_refuses_tokens_deleted_with_their_user_at_once():
    other = UserFactory(username="leaver")
    ApiToken.objects.create(user=other, key_hash=hash_token("gp_leaver"), prefix="gp_leaver")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Token gp_leaver")
    assert api.get("/api/v1/auth/tokens/").status_code == 200
    other.delete()
    assert api.get("/api/v1/auth/tokens/").status_code == 401
