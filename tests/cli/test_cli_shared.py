"""`gpu-portal submit/estimate --fraction/--gpu-memory`: a fraction of a shared GPU from the
command line, its parsing, and the portal's refusals passed on."""

import pytest

from portal.cli.output import parse_fraction, parse_memory_mib, what
from portal.models import Booking, Gpu
from portal.services.core import units
from tests.cli.conftest import token_for


@pytest.mark.parametrize(
    ("text", "mib"),
    [("20G", 20480), ("20GiB", 20480), ("20gb", 20480), ("512M", 512), ("1T", 1048576),
     ("2048", 2048), ("1024k", 1)],
)  # fmt: skip
def test_it_reads_memory_sizes_in_mib(text, mib):
    # The client and the API (services/core/units.py) read every size alike.
    assert parse_memory_mib(text) == units.parse_memory_mib(text) == mib


@pytest.mark.parametrize("text", ["", "20X", "-1G", "0", "1k", "1.5G", "２０G", "99999999999G"])
def test_it_refuses_what_is_not_a_memory_size(text):
    with pytest.raises(ValueError):
        parse_memory_mib(text)
    with pytest.raises(ValueError):
        units.parse_memory_mib(text)


@pytest.mark.parametrize(("text", "share"), [("0.25", 0.25), (".5", 0.5), ("0.999", 0.999)])
def test_it_reads_fractions(text, share):
    assert parse_fraction(text) == share


@pytest.mark.parametrize(
    "text", ["0", "1", "1.0", "1.5", "-0.5", "nan", "1e-3", "٠.٥", "0.1234567"]
)
def test_it_refuses_what_is_not_a_fraction(text):
    with pytest.raises(ValueError):
        parse_fraction(text)


def test_it_names_a_fraction_in_a_listing():
    assert what({"gpus": 1, "gpu_fraction": 0.25, "gpu_memory_mib": None}) == "0.25 shared GPU"
    assert what({"gpus": 1, "gpu_memory_mib": 20480}) == "shared GPU 20480MiB"


@pytest.fixture
def shared_site(site):
    Gpu.objects.filter(node=site["node"], index=1).update(sharing=Gpu.Sharing.SHARED)
    return site


@pytest.mark.django_db(transaction=True)
def test_it_submits_a_fraction_and_shows_it(shared_site, cli):
    token = token_for(shared_site["alice"])
    result = cli(
        "submit", "--fraction", "0.25", "--gpu-memory", "20G", "-t", "1h", "--", "python", "x.py",
        token=token,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    booking = Booking.objects.get()
    assert (booking.gpus, booking.gpu_fraction, booking.gpu_memory_mib) == (1, 0.25, 20480)
    listed = cli("queue", token=token).stdout
    assert "0.25 shared GPU 20480MiB" in listed


@pytest.mark.django_db(transaction=True)
def test_it_passes_on_the_portals_refusal_of_too_much_memory(shared_site, cli):
    token = token_for(shared_site["alice"])
    result = cli("submit", "--gpu-memory", "200G", "-t", "1h", "--", "true", token=token)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "gpu_memory_mib" in result.stderr and "81920 MiB" in result.stderr
    assert not Booking.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_bad_fraction_before_asking(shared_site, cli):
    result = cli("submit", "--fraction", "1.5", "-t", "1h", "--", "true", token="x")
    assert result.returncode == 2
    assert "not a fraction between 0 and 1" in result.stderr
