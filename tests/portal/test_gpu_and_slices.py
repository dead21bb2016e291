"""A whole GPU and its MIG slices, and slices of two MIG layouts, never go to two bookings at once.

PostgreSQL enforces it on its own (migration 0004): each allocation's compute slices come from
a trigger, and the exclusion constraint compares them, so these tests write rows directly.
"""

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from portal.models import Allocation, MigInstance
from portal.services.core.locking import is_allocation_clash
from portal.services.fleet.nodes import node_inventory_update
from tests.factories import AllocationFactory, BookingFactory, MigInstanceFactory, make_node


def _window(hours: float = 1):
    start = timezone.now().replace(microsecond=0)
    return {"start": start, "end": start + timedelta(hours=hours)}


@pytest.mark.django_db
def test_it_refuses_a_whole_gpu_while_one_of_its_slices_is_held():
    slice_ = MigInstanceFactory(slices=1)
    AllocationFactory(gpu=slice_.gpu, mig_instance=slice_, **_window())
    with pytest.raises(IntegrityError, match="portal_allocation_no_overlap"), transaction.atomic():
        AllocationFactory(gpu=slice_.gpu, mig_instance=None, **_window(2))


@pytest.mark.django_db
def test_it_refuses_a_slice_while_its_whole_gpu_is_held():
    slice_ = MigInstanceFactory(slices=2)
    AllocationFactory(gpu=slice_.gpu, mig_instance=None, **_window())
    with pytest.raises(IntegrityError, match="portal_allocation_no_overlap"), transaction.atomic():
        AllocationFactory(gpu=slice_.gpu, mig_instance=slice_, **_window())


@pytest.mark.django_db
def test_it_refuses_a_slice_of_a_new_layout_that_shares_compute_slices_with_a_held_one():
    node = make_node("n1", gpus=0)
    layout = {"index": 0, "uuid": "GPU-1", "model": "NVIDIA A100-80GB"}
    layout |= {"memory_total_mib": 81920, "mig_mode": True}
    old = [
        {"uuid": f"MIG-old-{i}", "profile": "3g.40gb", "slices": 3, "memory_total_mib": 1}
        for i in range(2)
    ]
    node_inventory_update(node=node, gpus=[{**layout, "mig_instances": old}])
    held = node.gpus.get().mig_instances.get(uuid="MIG-old-1")  # compute slices 3..5
    AllocationFactory(gpu=held.gpu, mig_instance=held, **_window())
    new = [
        {"uuid": f"MIG-new-{i}", "profile": "2g.20gb", "slices": 2, "memory_total_mib": 1}
        for i in range(3)
    ]
    node_inventory_update(node=node, gpus=[{**layout, "mig_instances": new}])
    first, second, third = (held.gpu.mig_instances.get(uuid=f"MIG-new-{i}") for i in range(3))
    AllocationFactory(gpu=held.gpu, mig_instance=first, **_window())  # slices 0..1: free
    for overlapping in (second, third):  # 2..3 and 4..5 share slices with the held 3..5
        with pytest.raises(IntegrityError), transaction.atomic():
            AllocationFactory(gpu=held.gpu, mig_instance=overlapping, **_window())


@pytest.mark.django_db
def test_it_takes_the_slots_from_the_database_not_from_the_writer():
    slice_ = MigInstanceFactory(slices=1)
    AllocationFactory(gpu=slice_.gpu, mig_instance=slice_, **_window())
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(
            booking=BookingFactory(),
            gpu=slice_.gpu,
            slot_start=6,
            slot_end=7,
            fraction=1.0,
            **_window(),
        )
    other_gpu = make_node("n2", gpus=1).gpus.get()
    with pytest.raises(IntegrityError, match="is not on GPU"), transaction.atomic():
        AllocationFactory(gpu=other_gpu, mig_instance=slice_, **_window(3))


@pytest.mark.django_db(transaction=True)
def test_it_lets_one_of_a_whole_gpu_and_a_slice_win_a_race_that_skips_the_app():
    slice_ = MigInstanceFactory(slices=3)
    window = _window()
    booking_ids = [BookingFactory().pk, BookingFactory().pk]
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def insert(booking_id: int, mig_instance_id: int | None):
        barrier.wait()
        try:
            with transaction.atomic():
                Allocation.objects.create(
                    booking_id=booking_id,
                    gpu_id=slice_.gpu_id,
                    mig_instance_id=mig_instance_id,
                    fraction=1.0,
                    **window,
                )
            outcomes.append("ok")
        except (IntegrityError, OperationalError) as exc:
            outcomes.append("refused" if is_allocation_clash(exc) else repr(exc))
        finally:
            connection.close()

    threads = [
        threading.Thread(target=insert, args=(booking_ids[0], None)),
        threading.Thread(target=insert, args=(booking_ids[1], slice_.pk)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok", "refused"]
    assert Allocation.objects.filter(gpu=slice_.gpu, live=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_it_places_existing_slices_and_fills_existing_allocations_when_migrating():
    executor = MigrationExecutor(connection)
    executor.migrate([("portal", "0003_telemetry")])
    apps = executor.loader.project_state([("portal", "0003_telemetry")]).apps
    try:
        node = apps.get_model("portal", "Node").objects.create(hostname="old")
        gpu = apps.get_model("portal", "Gpu").objects.create(
            node=node, index=0, uuid="GPU-old", model="A100", memory_mib=1, mig_mode=True
        )
        Mig = apps.get_model("portal", "MigInstance")
        migs = [
            Mig.objects.create(gpu=gpu, profile="3g", uuid=f"MIG-{i}", slices=3, memory_mib=1)
            for i in range(2)
        ]
        owner = apps.get_model("auth", "User").objects.create(username="old-owner")
        booking = apps.get_model("portal", "Booking").objects.create(
            owner=owner,
            project=apps.get_model("portal", "Project").objects.create(slug="old", name="old"),
            duration_s=3600,
            gpus=1,
            submitted_at=timezone.now(),
        )
        apps.get_model("portal", "Allocation").objects.create(
            booking=booking, gpu=gpu, mig_instance=migs[1], fraction=3 / 7, **_window()
        )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert list(Allocation.objects.values_list("slot_start", "slot_end")) == [(3, 6)]
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(
            booking_id=booking.pk, gpu_id=gpu.pk, mig_instance=None, fraction=1.0, **_window()
        )


@pytest.mark.django_db
def test_it_offers_no_device_that_shares_compute_slices_with_a_held_one():
    from portal.models import Gpu
    from portal.services.inventory.placement import devices_for_window

    node = make_node("n1", gpus=0)
    node.state = "up"
    node.save()
    layout = {"index": 0, "uuid": "GPU-1", "model": "NVIDIA A100-80GB"}
    layout |= {"memory_total_mib": 81920, "mig_mode": True}
    old = [{"uuid": "MIG-old", "profile": "3g.40gb", "slices": 3, "memory_total_mib": 1}]
    node_inventory_update(node=node, gpus=[{**layout, "mig_instances": old}])
    held = MigInstance.objects.get(uuid="MIG-old")  # compute slices 0..2
    window = _window()
    AllocationFactory(gpu=held.gpu, mig_instance=held, **window)
    new = [
        {"uuid": f"MIG-new-{i}", "profile": "2g.20gb", "slices": 2, "memory_total_mib": 1}
        for i in range(3)
    ]
    node_inventory_update(node=node, gpus=[{**layout, "mig_instances": new}])
    offered, free, _ = devices_for_window(gpus=1, mig_profile="2g.20gb", **window)
    assert [MigInstance.objects.get(pk=d.mig).uuid for d in offered] == ["MIG-new-2"]
    assert free == 1
    Gpu.objects.filter(pk=held.gpu_id).update(mig_mode=False)  # the GPU leaves MIG mode
    assert devices_for_window(gpus=1, **window) == (
        None,
        0,
        None,
    )  # not while a slice of it is held


def test_it_tells_two_slices_of_one_profile_on_one_gpu_apart(api):
    from tests.factories import GpuFactory

    gpu = GpuFactory(node=make_node("mig-node", gpus=0), index=0, mig_mode=True)
    for profile, slices, start in (("3g.40gb", 3, 0), ("1g.10gb", 1, 5), ("1g.10gb", 1, 6)):
        MigInstanceFactory(
            gpu=gpu, profile=profile, slices=slices, placement_start=start, memory_mib=10240
        )
    labels = sorted(str(m) for m in MigInstance.objects.all())
    assert labels == [
        "mig-node/gpu0/1g.10gb@5",
        "mig-node/gpu0/1g.10gb@6",
        "mig-node/gpu0/3g.40gb@0",
    ]
    listed = [m["label"] for m in api.get("/api/v1/mig-instances/").json()["results"]]
    assert sorted(listed) == labels
