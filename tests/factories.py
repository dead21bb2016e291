"""factory_boy factories for every model the tests build (one module, PX/HS style)."""

import itertools
from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from portal.models import (
    Allocation,
    Booking,
    Gpu,
    Membership,
    MigInstance,
    Node,
    NodeHeartbeat,
    Project,
    Quota,
    Sample,
)
from portal.models.inventory import MIG_SLICES_PER_GPU

_uuid = itertools.count(1)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ["username"]

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.django.Password("pw-secret-123")


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project
        django_get_or_create = ["slug"]

    slug = factory.Sequence(lambda n: f"proj{n}")
    name = factory.LazyAttribute(lambda p: p.slug.title())


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    project = factory.SubFactory(ProjectFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.MEMBER


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    project = factory.SubFactory(ProjectFactory)


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node
        skip_postgeneration_save = True  # the hook writes another table, not the node

    hostname = factory.Sequence(lambda n: f"node{n:02d}")
    state = Node.State.UP

    @factory.post_generation
    def last_seen(node, create, extracted, **kwargs):
        """Its agent reported just now, or at ``last_seen=...`` when given."""
        if create:
            node_seen(node, extracted or timezone.now())


def node_seen(node: Node, at) -> None:
    """Record that the node's agent last reported at ``at`` (its NodeHeartbeat row)."""
    NodeHeartbeat.objects.update_or_create(node_id=node.pk, defaults={"last_seen": at})


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.LazyFunction(lambda: f"GPU-test-{next(_uuid):08d}")
    model = "A100-80GB"
    memory_mib = 81920


class MigInstanceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = MigInstance

    gpu = factory.SubFactory(GpuFactory, mig_mode=True)
    profile = "3g.40gb"
    uuid = factory.LazyFunction(lambda: f"MIG-test-{next(_uuid):08d}")
    slices = 3
    memory_mib = 40960
    # Packed after the GPU's other instances, as the register places them.
    placement_start = factory.LazyAttribute(
        lambda o: min(
            sum(o.gpu.mig_instances.values_list("slices", flat=True)),
            MIG_SLICES_PER_GPU - o.slices,
        )
    )


class BookingFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Booking

    owner = factory.SubFactory(UserFactory)
    project = factory.SubFactory(ProjectFactory)
    gpus = 1
    duration_s = 3600
    submitted_at = factory.LazyFunction(timezone.now)


class AllocationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Allocation

    booking = factory.SubFactory(BookingFactory)
    gpu = factory.SubFactory(GpuFactory)
    start = factory.LazyFunction(timezone.now)
    end = factory.LazyAttribute(lambda a: a.start + timedelta(hours=1))
    fraction = 1.0


def make_node(
    hostname: str, *, gpus: int = 8, model: str = "A100-80GB", state: str = Node.State.UP
) -> Node:
    """A node with `gpus` whole GPUs of one model, indexed 0..gpus-1."""
    node = NodeFactory(hostname=hostname, state=state)
    for index in range(gpus):
        GpuFactory(node=node, index=index, model=model)
    return node


def make_mig_gpu(
    node: Node, index: int, profiles=("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
) -> Gpu:
    """A GPU in MIG mode on `node` with one instance per profile."""
    gpu = GpuFactory(node=node, index=index, mig_mode=True)
    for profile in profiles:
        slices = int(profile.split("g.")[0])
        MigInstanceFactory(gpu=gpu, profile=profile, slices=slices, memory_mib=slices * 10240)
    return gpu


def member(user, project, role: str = Membership.Role.MEMBER) -> Membership:
    return MembershipFactory(user=user, project=project, role=role)


class SampleFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Sample

    node = factory.SubFactory(NodeFactory)
    uuid = factory.LazyFunction(lambda: f"GPU-test-{next(_uuid):08d}")
    time = factory.LazyFunction(timezone.now)
    utilization_gpu = 50.0
    utilization_memory = 30.0
    memory_used_mib = 1024
    memory_total_mib = 81920
    temperature_c = 40.0
    power_w = 200.0


def make_agent_node(hostname: str, *, gpus: int = 2, mig_gpus: int = 0) -> tuple[Node, str]:
    """A node with whole GPUs, then `mig_gpus` GPUs in MIG mode, and a fresh agent token."""
    from portal.services.fleet.nodes import node_token_issue

    node = make_node(hostname, gpus=gpus)
    for index in range(gpus, gpus + mig_gpus):
        make_mig_gpu(node, index)
    # As if its agent had registered from loopback, where the tests' agents run.
    Node.objects.filter(pk=node.pk).update(registered_from="127.0.0.1")
    node.registered_from = "127.0.0.1"
    return node, node_token_issue(hostname=hostname)


def make_active_booking(devices, *, owner=None, command: str = "", **kwargs) -> Booking:
    """An active booking holding these devices (Gpu or MigInstance) from a minute ago for an hour."""
    now = timezone.now()
    booking = BookingFactory(
        owner=owner or UserFactory(),
        state=Booking.State.ACTIVE,
        started_at=now - timedelta(minutes=1),
        command=command,
        **kwargs,
    )
    for device in devices:
        is_mig = isinstance(device, MigInstance)
        AllocationFactory(
            booking=booking,
            gpu=device.gpu if is_mig else device,
            mig_instance=device if is_mig else None,
            start=now - timedelta(minutes=1),
            end=now + timedelta(hours=1),
            fraction=device.fraction if is_mig else 1.0,
        )
    return booking


def make_shared_booking(
    gpu, *, share: float, memory_mib: int, owner=None, command: str = "", **kwargs
) -> Booking:
    """An active booking of a fraction of `gpu` (made shared): `share` of its compute and
    `memory_mib` of its memory, from a minute ago for an hour."""
    now = timezone.now()
    Gpu.objects.filter(pk=gpu.pk).update(sharing=Gpu.Sharing.SHARED)
    booking = BookingFactory(
        owner=owner or UserFactory(),
        state=Booking.State.ACTIVE,
        started_at=now - timedelta(minutes=1),
        command=command,
        gpu_fraction=share,
        gpu_memory_mib=memory_mib,
        **kwargs,
    )
    AllocationFactory(
        booking=booking,
        gpu=gpu,
        start=now - timedelta(minutes=1),
        end=now + timedelta(hours=1),
        fraction=share,
        share=share,
        gpu_memory_mib=memory_mib,
    )
    return booking
