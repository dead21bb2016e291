from django.core.exceptions import ValidationError
from django.db import models

from agents.protocol import ADDRESS_RULE, HOSTNAME_RULE, is_hostname, is_node_address

MIG_SLICES_PER_GPU = 7


def validate_node_name(value: str) -> None:
    """A node's name reaches other nodes' hostfiles: an RFC 1123 host name (agents.protocol)."""
    if not is_hostname(value):
        raise ValidationError(f"{value!r} {HOSTNAME_RULE}.")


def validate_node_address(value: str) -> None:
    """A node's address becomes every rank's MASTER_ADDR: an IP address or a host name."""
    if value and not is_node_address(value):
        raise ValidationError(f"{value!r} {ADDRESS_RULE}.")


def mig_fraction(slices: int) -> float:
    """Share of a whole GPU that a MIG instance of `slices` compute slices stands for."""
    return slices / MIG_SLICES_PER_GPU


def runtimes_of(text: str) -> tuple[str, ...]:
    """A node's stored container runtimes ("podman,apptainer") as names."""
    return tuple(text.split(",")) if text else ()


class Node(models.Model):
    """A GPU server running the portal's agent. Only nodes that are up get new work."""

    class State(models.TextChoices):
        UP = "up", "Up"
        DOWN = "down", "Down"
        DRAIN = "drain", "Drain"
        # Drained for a maintenance window; back up by itself at the window's end.
        MAINTENANCE = "maintenance", "Maintenance"

    hostname = models.CharField(max_length=253, unique=True, validators=[validate_node_name])
    state = models.CharField(max_length=16, choices=State.choices, default=State.DOWN)
    state_reason = models.CharField(max_length=300, blank=True)
    agent_version = models.CharField(max_length=64, blank=True)
    # The node's address on the site network, as its agent reports it (--address); blank: the
    # hostname. The other nodes of a multi-node job reach rank 0 there (MASTER_ADDR).
    address = models.CharField(max_length=253, blank=True, validators=[validate_node_address])
    # The container runtimes its agent reported, comma-separated (agents.protocol's
    # CONTAINER_RUNTIMES names): text, so the allocation pass reads it without decoding JSON.
    container_runtimes = models.CharField(max_length=100, blank=True)
    # The client address its agent last registered from (not what it reports): the one address
    # the session proxy connects to on this node (docs/interactive.md).
    registered_from = models.GenericIPAddressField(
        null=True,
        blank=True,
        help_text="Where the agent last registered from; the portal reaches its sessions there.",
    )

    # Where the node sits on the site network (a rack or switch), set by the site: a multi-node
    # booking prefers nodes of one group (docs/scheduling.md, Placement). Blank: none.
    network_group = models.CharField(
        max_length=64,
        blank=True,
        help_text="Rack or switch the node hangs off; multi-node bookings prefer one group.",
    )

    # The host resources its agent reported at the last register (docs/agent.md, "Cores and
    # memory"): CPU cores and host memory jobs may use, after what the site reserves for the
    # system. Null: unknown until an agent that reports them registers.
    cpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="CPU cores jobs may use, as its agent reports."
    )
    memory_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="Host memory (MiB) jobs may use, as its agent reports."
    )

    # sha256 of the agent token; the token itself is shown once by `manage.py agent_token`.
    agent_token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    def runtimes(self) -> tuple[str, ...]:
        """The container runtimes its agent reported."""
        return runtimes_of(self.container_runtimes)


class NodeHeartbeat(models.Model):
    """When a node's agent last reported (one row per node, written on every heartbeat).

    Kept off the node row: bookings share-lock the nodes they are placed on and the pass's starts
    lock theirs, and an agent's report every few seconds must neither wait for those locks nor
    hold them up. The node row changes only when the node's state does.
    """

    node = models.OneToOneField(
        Node, on_delete=models.CASCADE, primary_key=True, related_name="heartbeat"
    )
    last_seen = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.node_id} seen {self.last_seen:%Y-%m-%d %H:%M:%S}"


class Gpu(models.Model):
    """A physical GPU in a node. Bookable as a whole when MIG mode is off.

    Its topology (PCI bus id, NUMA node, NVLink peers by index on its node) is what its agent
    reported at the last register; the scheduler places multi-GPU bookings by it.

    A slot (node, index) holds a part (the card, known by its UUID). A card that its agent stops
    reporting, or that another card replaces at its index, is retired, not deleted, once bookings
    have used it: its row stays for history, accounting and audit, and it is never offered
    again. Only live cards hold their slot; the UUID stays unique, so a retired card reported
    again comes back as the same row.

    ``sharing``: an exclusive GPU (the default) goes whole to one booking (or, in MIG mode, by
    slices); a shared one is offered only to fractional bookings (``Booking.gpu_fraction`` /
    ``gpu_memory_mib``), several at once, never more than 1.0 of its compute or more than its
    memory in all (docs/scheduling.md, "Shared GPUs").
    """

    class Sharing(models.TextChoices):
        """Whether the GPU goes whole to one booking or in fractions to several."""

        EXCLUSIVE = "exclusive", "Exclusive"
        SHARED = "shared", "Shared"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=96, unique=True)
    model = models.CharField(max_length=64, db_index=True, help_text="e.g. H100-80GB")
    memory_mib = models.PositiveIntegerField()
    mig_mode = models.BooleanField(default=False)
    sharing = models.CharField(
        max_length=9,
        choices=Sharing.choices,
        default=Sharing.EXCLUSIVE,
        help_text="Exclusive: whole (or MIG slices) to one booking; shared: fractions to several.",
    )
    retired_at = models.DateTimeField(
        null=True, blank=True, help_text="When its agent stopped reporting it; never offered since."
    )
    # Topology, as its agent last reported it (empty / null: not reported).
    pci_bus_id = models.CharField(max_length=32, blank=True)
    numa_node = models.PositiveSmallIntegerField(null=True, blank=True)
    nvlink_peers = models.JSONField(
        default=list, blank=True, help_text="Indexes of the GPUs of its node it has an NVLink to."
    )

    class Meta:
        ordering = ["node__hostname", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=models.Q(retired_at__isnull=True),
                name="%(app_label)s_%(class)s_slot",
            ),
            models.CheckConstraint(
                condition=models.Q(sharing__in=["exclusive", "shared"]),
                name="%(app_label)s_%(class)s_sharing_known",
            ),
            # A GPU in MIG mode is bookable by its slices only: never in fractions too.
            models.CheckConstraint(
                condition=models.Q(sharing="exclusive") | models.Q(mig_mode=False),
                name="%(app_label)s_%(class)s_shared_not_mig",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.hostname}/gpu{self.index}"


def mig_label(*, hostname: str, gpu_index: int, profile: str, placement_start: int) -> str:
    """A MIG slice's name: its GPU, its profile and the first compute slice it holds, so two
    slices of one profile on one GPU (1g.10gb twice) are told apart: gpu-a03/gpu4/1g.10gb@5."""
    return f"{hostname}/gpu{gpu_index}/{profile}@{placement_start}"


class MigInstance(models.Model):
    """A MIG slice of a GPU in MIG mode (e.g. 3g.40gb); each one is a bookable device.

    After a re-partition (or when its GPU leaves MIG mode) an instance that bookings have used is
    retired, not deleted: kept for history, never offered again (the UUID stays unique).
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="mig_instances")
    profile = models.CharField(max_length=32, db_index=True, help_text="e.g. 3g.40gb")
    uuid = models.CharField(max_length=96, unique=True)
    slices = models.PositiveSmallIntegerField()
    placement_start = models.PositiveSmallIntegerField(
        default=0,
        help_text="First compute slice (0-6) the instance occupies on its GPU; it holds "
        "[placement_start, placement_start + slices).",
    )
    memory_mib = models.PositiveIntegerField()
    retired_at = models.DateTimeField(
        null=True, blank=True, help_text="When its agent stopped reporting it; never offered since."
    )

    class Meta:
        ordering = ["gpu__node__hostname", "gpu__index", "uuid"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(placement_start__lte=MIG_SLICES_PER_GPU - models.F("slices")),
                name="%(app_label)s_%(class)s_placement_fits",
            ),
        ]

    def __str__(self) -> str:
        return mig_label(
            hostname=self.gpu.node.hostname,
            gpu_index=self.gpu.index,
            profile=self.profile,
            placement_start=self.placement_start,
        )

    @property
    def fraction(self) -> float:
        return mig_fraction(self.slices)
