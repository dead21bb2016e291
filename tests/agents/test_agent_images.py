"""Image references as the runtimes read them (distribution/reference's grammar, as Podman and
Docker use it), and the site's allow-list matched by host and whole path segments."""

import pytest

from agents.images import Image, ImageError, image_allowed, image_parse, source_parse
from agents.protocol import IMAGE_MAX

SHA = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "image", "name"),
    [
        (
            "docker://nvcr.io/nvidia/pytorch:24.05-py3",
            Image("docker", "nvcr.io", "nvidia/pytorch", "24.05-py3"),
            "nvcr.io/nvidia/pytorch:24.05-py3",
        ),
        ("nvcr.io/nvidia/pytorch", Image("docker", "nvcr.io", "nvidia/pytorch"), None),
        # docker.io is the default registry, and a single name is one of its library/ images.
        ("ubuntu", Image("docker", "docker.io", "library/ubuntu"), "docker.io/library/ubuntu"),
        ("ubuntu:22.04", Image("docker", "docker.io", "library/ubuntu", "22.04"), None),
        ("pytorch/pytorch", Image("docker", "docker.io", "pytorch/pytorch"), None),
        ("index.docker.io/ubuntu", Image("docker", "docker.io", "library/ubuntu"), None),
        ("localhost/tiny:1", Image("docker", "localhost", "tiny", "1"), "localhost/tiny:1"),
        ("localhost:5000/a/b", Image("docker", "localhost:5000", "a/b"), None),
        ("[::1]:5000/a", Image("docker", "[::1]:5000", "a"), None),
        ("Reg.Example/a", Image("docker", "Reg.Example", "a"), None),  # capitals: a host
        ("nvcr.io/a__b.c-d--e/f_g", Image("docker", "nvcr.io", "a__b.c-d--e/f_g"), None),
        (f"nvcr.io/x@{SHA}", Image("docker", "nvcr.io", "x", "", SHA), f"nvcr.io/x@{SHA}"),
        (f"nvcr.io/x:1@{SHA}", Image("docker", "nvcr.io", "x", "1", SHA), None),
        (f"x:{'t' * 128}", Image("docker", "docker.io", "library/x", "t" * 128), None),
        ("oras://reg.example.org/torch:1", Image("oras", "reg.example.org", "torch", "1"), None),
        ("library://lolcow", Image("library", "", "lolcow"), "lolcow"),
        (
            "library://sylabs/examples/lolcow:latest",
            Image("library", "", "sylabs/examples/lolcow", "latest"),
            None,
        ),  # fmt: skip
        ("shub://vsoch/hello-world", Image("shub", "", "vsoch/hello-world"), None),
        ("/shared/images/torch.sif", Image("file", "", "/shared/images/torch.sif"), None),
        ("/shared//images/./torch.sif", Image("file", "", "/shared/images/torch.sif"), None),
        ("//shared/torch.sif", Image("file", "", "/shared/torch.sif"), "/shared/torch.sif"),
    ],
)
def test_it_parses_an_image_as_its_runtime_reads_it(text, image, name):
    assert image_parse(text) == image
    if name:
        assert image_parse(text).name == name


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # The issue's: a path out of the allowed directory, and what podman refuses.
        ("/shared/images/../../scratch/evil.sif", "no '..'"),
        ("docker://nvcr.io/nvidia/../evil", "'..' is not a repository path component"),
        ("nvcr.io@evil", "digest 'evil'"),
        ("nvcr.io/nvidia/pytorch latest", "no spaces"),
        ("nvcr.io/x\n", "no spaces or control characters"),
        ("nvcr.io/x\x00", "control characters"),
        ("", "no spaces"),
        ("shared/images/torch.sif", "absolute path"),
        ("/shared/images/torch", "a .sif file"),
        ("docker://", "'' is not a repository path component"),
        ("nvcr.io/", "'' is not a repository path component"),
        ("nvcr.io//x", "'' is not a repository path component"),
        ("nvcr.io/NVIDIA/x", "'NVIDIA' is not a repository path component"),
        ("nvcr.io/-x", "'-x'"),
        ("nvcr.io/x.", "'x.'"),
        ("nvcr.io/a___b", "'a___b'"),
        ("nvcr.io/x:", "tag ''"),
        ("nvcr.io/x:-1", "tag '-1'"),
        (f"x:{'t' * 129}", "tag"),
        ("x:t\u00e4", "tag"),  # \w is ASCII in the grammar
        ("nvcr.io/x@sha256:abc", "digest"),
        ("nvcr.io/x@md5:" + "ab" * 16, "digest"),
        ("nvcr.io/x@sha256:" + "AB" * 32, "digest"),
        ("-bad.example/x", "not a registry host"),
        ("bad-.example/x", "not a registry host"),
        ("reg.example:port/x", "not a registry host"),
        ("a" * 64, "64-digit hex id"),
        ("oras://torch:1", "names its registry host"),
        ("ftp://host/x", "ftp:// is not a transport"),
        ("docker-archive:/tmp/x.tar", "not a registry host"),
        ("nvcr.io/" + "a" * 250, "longer than 255"),
        ("x" * (IMAGE_MAX + 1), f"at most {IMAGE_MAX}"),
    ],
)
def test_it_refuses_what_no_runtime_would_run(text, says):
    with pytest.raises(ImageError) as raised:
        image_parse(text)
    assert says in str(raised.value)


@pytest.mark.parametrize(
    ("source", "image", "admitted"),
    [
        ("docker://nvcr.io", "docker://nvcr.io/nvidia/pytorch:1", True),
        ("docker://nvcr.io", "nvcr.io/anything/at/all", True),
        ("docker://nvcr.io", "docker://nvcr.io.evil.example/x", False),  # a host, not a prefix
        ("docker://nvcr.io", "docker://nvcr.io:5000/x", False),
        ("docker://nvcr.io", "docker://NVCR.IO/x", True),  # host names have no case
        ("docker://nvcr.io/nvidia", "docker://nvcr.io/nvidia/pytorch:1", True),
        ("docker://nvcr.io/nvidia/", "docker://nvcr.io/nvidia/pytorch:1", True),
        ("docker://nvcr.io/nvidia", "docker://nvcr.io/nvidia-evil/x", False),  # whole segments
        ("docker://nvcr.io/nvidia", "docker://nvcr.io/x/nvidia", False),
        ("docker://nvcr.io/nvidia", "oras://nvcr.io/nvidia/x", False),  # another transport
        ("docker://docker.io/library", "ubuntu:22.04", True),
        ("docker://docker.io/library", "evil/ubuntu", False),
        ("docker://docker.io/pytorch", "pytorch/pytorch:2", True),
        ("localhost", "localhost/tiny:1", True),
        ("oras://registry.example.org/", "oras://registry.example.org/torch:1", True),
        ("oras://registry.example.org/", "oras://registry.example.org.evil/t", False),
        ("library://sylabs", "library://sylabs/examples/lolcow", True),
        ("library://sylabs", "library://sylabs-evil/x", False),
        ("/shared/images/", "/shared/images/torch.sif", True),
        ("/shared/images", "/shared/images/team/torch.sif", True),
        ("/shared/images/", "/shared/images-evil/torch.sif", False),
        ("/shared/images/", "/shared/torch.sif", False),
        ("/shared/images/", "/shared//images/./torch.sif", True),
        ("/shared/images/", "docker://shared/images", False),
        ("docker://nvcr.io:tag", "docker://nvcr.io/x", False),  # no source: admits nothing
    ],
)
def test_it_admits_an_image_by_host_and_whole_path_segments(source, image, admitted):
    assert image_allowed(image_parse(image), [source]) is admitted


@pytest.mark.parametrize(
    "source",
    [
        "docker://nvcr.io/nvidia/pytorch:24.05",
        "docker://nvcr.io/../x",
        "/shared/images/../../scratch",
        "docker://nvcr.io:tag",
        "ftp://host",
        "docker://nvcr.io/Nvidia",
    ],
)
def test_it_refuses_a_source_that_names_no_host_prefix_or_directory(source):
    with pytest.raises(ImageError):
        source_parse(source)
