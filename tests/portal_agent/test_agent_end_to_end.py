"""A real agent (agents.agent.Agent on the simulated backend) against the real portal over HTTP."""

from pathlib import Path

import pytest
from django.utils import timezone

from portal.models import Booking, Gpu, Node, Sample
from portal.services.booking.bookings import booking_cancel
from portal.services.inventory.telemetry_cache import latest_by_uuid
from tests.agent_cycles import cycle_until
from tests.factories import UserFactory, make_active_booking

pytestmark = pytest.mark.django_db(transaction=True)

HOSTNAME = "sim-e2e"


@pytest.fixture
def make_agent(real_agents):
    return lambda: real_agents(HOSTNAME, "2xH100-80GB,1xA100-80GB:mig=3g.40gb+2x2g.20gb")


def test_it_registers_reports_runs_a_booking_and_reconciles_after_a_restart(
    make_agent, tmp_path, allocation_passes
):
    agent = make_agent()
    node = Node.objects.get(hostname=HOSTNAME)
    cycle_until(agent, lambda: Gpu.objects.filter(node=node).count() == 3)
    assert Node.objects.get(pk=node.pk).state == "up"
    mig_uuids = [m.uuid for gpu in agent.backend.discover() for m in gpu.mig_instances]
    assert len(mig_uuids) == 3

    # Its readings appear in the database and the cache; MIG utilization stays null.
    cycle_until(agent, lambda: Sample.objects.filter(uuid=mig_uuids[0]).exists())
    assert Sample.objects.filter(uuid=mig_uuids[0]).first().utilization_gpu is None
    whole = Gpu.objects.get(node=node, index=0)
    assert Sample.objects.filter(uuid=whole.uuid, utilization_gpu__isnull=False).exists()
    assert set(latest_by_uuid([whole.uuid, *mig_uuids])) == {whole.uuid, *mig_uuids}

    # A batch booking on its devices is launched by the agent; its exit finishes it.
    alice = UserFactory(username="alice")
    hello = make_active_booking([whole], owner=alice, command="sh -c 'echo hello; exit 0'")
    cycle_until(agent, lambda: Booking.objects.get(pk=hello.pk).state != "active")
    hello.refresh_from_db()
    assert hello.state == "finished"
    assert (hello.exit_code, hello.log_tail) == (0, "hello\n")

    # A long job runs; the agent stops; desired state changes meanwhile; a new agent re-syncs
    # without relaunching the job that is still running.
    marker = tmp_path / "launches"
    second = Gpu.objects.get(node=node, index=1)
    long = make_active_booking([second], owner=alice, command=f"echo x >> {marker}; sleep 60")
    cycle_until(agent, lambda: long.pk in agent.dispatcher.jobs)
    pid = agent.dispatcher.jobs[long.pk].pid
    agent.close()

    quick = make_active_booking([whole], owner=alice, command="echo again")
    again = make_agent()
    assert again.dispatcher.jobs[long.pk].pid == pid  # re-adopted from the state file
    cycle_until(again, lambda: Booking.objects.get(pk=quick.pk).state == "finished")
    assert Path(marker).read_text() == "x\n"  # launched once, not twice
    assert Booking.objects.get(pk=long.pk).state == "active"

    # Cancelling it in the portal stops it on the node.
    booking_cancel(user=alice, booking_id=long.pk, now=timezone.now())
    cycle_until(again, lambda: long.pk not in again.dispatcher.jobs)
    assert Booking.objects.get(pk=long.pk).state == "cancelled"
