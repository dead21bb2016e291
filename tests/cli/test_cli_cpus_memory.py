"""`gpu-portal submit/estimate --cpus N --mem SIZE`: cores and host memory per node from the
command line (the client stays on Python 3.8: test_cli_python_version checks the source)."""

import pytest

from portal.cli.commands import _booking_body
from portal.cli.main import build_parser


@pytest.mark.parametrize("command", ["submit", "estimate"])
@pytest.mark.parametrize(
    ("mem", "mib"), [("64G", 65536), ("512M", 512), ("1T", 1048576), ("65536", 65536)]
)
def test_it_sends_cores_and_memory_in_mib(command, mem, mib):
    args = build_parser().parse_args([command, "-g", "2", "--cpus", "16", "--mem", mem])
    body = _booking_body(args)
    assert (body["cpus"], body["memory_mib"]) == (16, mib)


def test_it_sends_neither_unless_asked():
    body = _booking_body(build_parser().parse_args(["submit", "-g", "1"]))
    assert "cpus" not in body and "memory_mib" not in body


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--mem", "64X"], "is not a memory size"),
        (["--mem", "0"], "between 1 and"),
        (["--cpus", "-2"], "is not a whole number"),
        (["--cpus", "1.5"], "is not a whole number"),
    ],
)
def test_it_refuses_a_bad_size_or_count_as_a_usage_error(flags, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["submit", "-g", "1", *flags])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.django_db(transaction=True)
def test_it_shows_the_cores_and_memory_asked_and_held_per_node(site, cli):
    from portal.models import Booking, Node
    from tests.cli.conftest import token_for

    Node.objects.filter(pk=site["node"].pk).update(cpus=32, memory_mib=256 * 1024)
    token = token_for(site["alice"])
    result = cli("submit", "-g", "1", "-t", "1h", "--cpus", "16", "--mem", "64G", token=token)
    assert result.returncode == 0, result.stderr
    booking = Booking.objects.get()
    shown = cli("show", str(booking.pk), token=token).stdout
    line = next(line for line in shown.splitlines() if line.startswith("Cores and memory:"))
    assert line.endswith("16 cores, 64 GiB per node; holds cli-a: 16 cores, 64 GiB"), shown
    assert booking.describe_request() == "1 GPU, 16 cores, 64 GiB per node"
    # Asked for nothing: the site's default, and what that comes to on its node.
    cli("submit", "-g", "1", "-t", "1h", token=token)
    other = Booking.objects.exclude(pk=booking.pk).get()
    shown = cli("show", str(other.pk), token=token).stdout
    assert "the site's default; holds cli-a: 10 cores, 85.3 GiB" in shown, shown
