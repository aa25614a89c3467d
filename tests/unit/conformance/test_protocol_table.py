"""A protocol is one row of conformance/spec/protocols.py: its driver, its profile, its docs page
and its place in detection all come from the row, and the run never asks which kind of target it
holds outside the two places that turn a wire kind into its address and its pace request."""

from __future__ import annotations

import ast
from pathlib import Path

from conformance.cli import build_parser
from conformance.drivers import Driver, driver_class
from conformance.drivers.detect import PROBES
from conformance.spec.profiles import PROFILES
from conformance.spec.protocols import DETECTION_ORDER, GRPC_PROTOCOLS, PROTOCOLS, TABLE, load

ROOT = Path(__file__).resolve().parents[3]
TARGET_KINDS = {"HttpTarget", "GrpcTarget", "OpenAIEndpoint", "Endpoint"}
WIRE_NAMES = {"wire_of", "HTTP_PROTOCOLS", "GRPC_PROTOCOLS"}
# where a target's kind is the subject: the targets themselves, the HTTP driver, the table
OWNERS = ("conformance/harness/target.py", "conformance/drivers/openai/", "conformance/spec/protocols.py")
RUN_MODULES = ("conformance/harness/", "conformance/report/", "conformance/commands.py", "conformance/cli.py")
ASKING = {"conformance/harness/connect.py", "conformance/harness/pace.py"}


def test_every_row_names_its_driver_profile_and_page() -> None:
    for row in TABLE:
        target = load(row.driver)
        assert isinstance(target, type) and getattr(target, "protocol", None) == row.id, row.id
        assert PROFILES[row.id].protocol == row.id
        assert (ROOT / row.page).is_file(), row.page
        if row.wire == "grpc":
            assert issubclass(driver_class(row.id), Driver)
    assert set(DETECTION_ORDER) == set(GRPC_PROTOCOLS) == set(PROBES)


def test_the_clis_protocol_choices_are_the_tables() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    run = commands.choices["run"]  # type: ignore[index]
    protocol = next(a for a in run._actions if a.dest == "protocol")
    assert tuple(protocol.choices) == ("auto", *PROTOCOLS)
    assert all(row.id in (protocol.help or "") for row in TABLE)


def _asks(path: Path, *, by_wire: bool) -> bool:
    """Whether the module asks a target's kind: ``isinstance`` against a target or address class,
    or (``by_wire``) a protocol's wire kind."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            if {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} & TARGET_KINDS:
                return True
        if by_wire and isinstance(node, ast.Name) and node.id in WIRE_NAMES:
            return True
    return False


def test_at_most_two_places_ask_whether_a_target_is_http() -> None:
    """Cases and the registry may name wire kinds (a case is registered for its protocols); the
    run's own modules may not, but for the two that map a wire kind to its address and its pace."""
    asking = set()
    for path in sorted((ROOT / "conformance").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if not relative.startswith(OWNERS) and _asks(path, by_wire=relative.startswith(RUN_MODULES)):
            asking.add(relative)
    assert asking <= ASKING, asking - ASKING
