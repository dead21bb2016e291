"""The job environment on the Book form and the booking page: working directory, variables,
signal; each node's process of a multi-node booking with its exit code and output."""

import pytest

from portal.models import Booking, NodeRun
from tests.factories import make_active_booking

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_in(client, user, project):
    client.force_login(user)
    return client


FORM = {
    "project": "vision",
    "kind": "gpus",
    "gpus": "1",
    "when": "asap",
    "duration_hours": "1",
    "qos": "normal",
    "command": "python train.py",
}


def test_it_books_a_job_with_its_environment_from_the_form(client_in, project, cluster):
    response = client_in.post(
        "/book/",
        {**FORM, "workdir": "/scratch/run", "env": "LR=3e-4\n\nNOTE=a=b\n", "signal": "USR1@90"},
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    booking = Booking.objects.get()
    assert (booking.workdir, booking.env) == ("/scratch/run", {"LR": "3e-4", "NOTE": "a=b"})
    assert (booking.signal_name, booking.signal_before_s) == ("USR1", 90)
    body = client_in.get(f"/bookings/{booking.pk}/").content.decode()
    assert "/scratch/run" in body and f"gpu-portal-{booking.pk}.out" in body
    assert "SIGUSR1 90 s before" in body


@pytest.mark.parametrize(
    ("extra", "field", "said"),
    [
        ({"env": "JUSTANAME"}, "env", "Line 1: write NAME=value."),
        ({"env": "WORLD_SIZE=3"}, "env", "WORLD_SIZE: Is set by the portal for every job."),
        ({"workdir": "relative/dir"}, "workdir", "Must be an absolute path"),
        ({"signal": "STOP@5"}, "signal", "not a signal a job can catch"),
        ({"signal": "USR1@3700"}, "signal", "not within the booking's 3600 s"),
        ({"env": "A=1\n" * 20_000}, "env", "at most 65728 characters"),
    ],
)
def test_it_shows_a_bad_job_environment_at_its_field(
    client_in, project, cluster, extra, field, said
):
    response = client_in.post("/book/", {**FORM, **extra})
    assert response.status_code == 400
    html = response.content.decode().split(f'data-field="{field}"', 1)[1].split("</div>", 1)[0]
    assert said in html.replace("&#x27;", "'"), html
    assert not Booking.objects.exists()


def test_it_shows_each_nodes_process_of_a_multi_node_booking(client_in, user, project, cluster):
    node_a, node_b = cluster
    gpus = [node_a.gpus.first(), node_b.gpus.first()]
    booking = make_active_booking(gpus, owner=user, project=project, gpus=2, command="train")
    NodeRun.objects.create(booking=booking, node=node_a, rank=0, state="stopped", exit_code=-15)
    NodeRun.objects.create(
        booking=booking, node=node_b, rank=1, state="exited", exit_code=3, log_tail="CUDA OOM\n"
    )
    body = client_in.get(f"/bookings/{booking.pk}/").content.decode()
    table = body.split('class="node-runs"', 1)[1].split("</table>", 1)[0]
    rows = table.split("<tr>")[2:]
    assert "node-a" in rows[0] and "-15" in rows[0]
    assert "node-b" in rows[1] and ">3<" in rows[1] and "CUDA OOM" in rows[1]
    assert f"gpu-portal-{booking.pk}.&lt;rank&gt;.out" in body
