"""Cores and host memory on the Book form: stored as asked, refused at their field."""

import pytest

from portal.models import Booking
from tests.web.test_job_pages import FORM

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_in(client, user, project):
    client.force_login(user)
    return client


def test_it_books_cores_and_memory_from_the_form(client_in, project, cluster):
    response = client_in.post("/book/", {**FORM, "cpus": "16", "memory_mib": "64G"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Booking.objects.values_list("cpus", "memory_mib").get() == (16, 65536)


@pytest.mark.parametrize(
    ("extra", "field", "said"),
    [
        ({"cpus": "0"}, "cpus", "greater than or equal to 1"),
        ({"memory_mib": "64X"}, "memory_mib", "is not a memory size"),
    ],
)
def test_it_shows_bad_cores_or_memory_at_its_field(client_in, project, cluster, extra, field, said):
    response = client_in.post("/book/", {**FORM, **extra})
    assert response.status_code == 400
    html = response.content.decode().split(f'data-field="{field}"', 1)[1].split("</div>", 1)[0]
    assert said in html.replace("&#x27;", "'"), html
    assert not Booking.objects.exists()
