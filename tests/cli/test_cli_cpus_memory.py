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
