"""The sdist and the wheel ship every file the packages read, as a real file: what a clean
environment meets is what this checkout holds."""

from __future__ import annotations

import subprocess
import tarfile
import zipfile

from .dist import ROOT, Dist

PACKAGES = ("lmrpc", "conformance", "reference_server")


def data_files() -> dict[str, bytes]:
    """Every file git tracks in a package folder that is not Python source, with its bytes (a
    symlink's target's), keyed by its path in the wheel; and the generated code's data."""
    tracked = subprocess.run(
        ["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    wanted = {
        path: (ROOT / path).read_bytes()
        for path in tracked
        if not path.endswith(".py") and (ROOT / path).is_file()
    }
    for path in (ROOT / "gen").glob("descriptor_set*.binpb"):
        wanted[f"lmrpc/_gen/{path.name}"] = path.read_bytes()
    for path in (ROOT / "proto" / "lmrpc" / "v1").glob("*.proto"):
        wanted[f"lmrpc/proto/lmrpc/v1/{path.name}"] = path.read_bytes()
    return wanted


def test_the_wheel_holds_every_data_file_its_packages_read(dist: Dist) -> None:
    wanted = data_files()
    assert "conformance/spec/contract.md" in wanted and "lmrpc/_gen/descriptor_set.binpb" in wanted
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        missing = sorted(set(wanted) - names)
        assert not missing, f"the wheel lacks {missing}"
        differ = [path for path, data in wanted.items() if wheel.read(path) != data]
        assert not differ, f"the wheel's copies differ from the tree's: {differ}"
        for info in wheel.infolist():  # a symlink in a zip is a mode bit; pip would unpack it as text
            assert (info.external_attr >> 16) & 0o170000 != 0o120000, f"{info.filename} is a symlink"


def test_the_sdist_holds_them_as_real_files_and_builds_the_wheel(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as sdist:
        members = {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}
        links = sorted(name for name, m in members.items() if m.issym() or m.islnk())
        assert not links, f"the sdist has links {links}"
        missing = sorted(path for path in data_files() if path not in members)
        # the generated packages sit under lmrpc/_gen in the sdist as in the wheel
        assert not missing, f"the sdist lacks {missing}"
    # python -m build made the wheel from the sdist alone: one wheel, of the sdist's version
    assert dist.wheel.name.split("-")[1] == dist.sdist.name.removesuffix(".tar.gz").split("-")[1]
