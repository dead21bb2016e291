"""Two staff ask for a layout of one GPU at once: the database keeps one open change per GPU,
exactly one wins and the other gets 409 (real PostgreSQL, two threads)."""

import threading

import pytest
from django.db import connection

from portal.errors import Conflict
from portal.models import MigLayoutChange
from portal.services.allocation.mig_changes import mig_layout_request
from tests.factories import NodeFactory, UserFactory, make_mig_gpu

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_lets_one_of_two_racing_changes_of_a_gpu_win():
    if connection.vendor != "postgresql":
        pytest.skip("races run on PostgreSQL")
    gpu = make_mig_gpu(NodeFactory(hostname="node-r", state="up"), 0)
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    layouts = ([{"profile": "7g.80gb"}], [{"profile": "3g.40gb"}, {"profile": "3g.40gb"}])
    barrier, outcomes = threading.Barrier(2), []

    def ask(instances):
        try:
            barrier.wait()
            mig_layout_request(gpu_id=gpu.pk, instances=instances, by=root)
            outcomes.append("won")
        except Conflict:
            outcomes.append("409")
        finally:
            connection.close()

    threads = [threading.Thread(target=ask, args=(layout,)) for layout in layouts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["409", "won"]
    assert MigLayoutChange.objects.filter(gpu=gpu).count() == 1
