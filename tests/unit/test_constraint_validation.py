"""The frontend's reading of GenerateRequest.constraint (frontend/validation.py, CONSTRAIN-2, CAP-1),
the part that needs no compiler; whether a constraint compiles is tested over gRPC
(tests/integration/test_constrained_decoding.py)."""

from __future__ import annotations

import pytest
from grpclib import GRPCError, Status

from lmrpc.v1 import Capabilities, Choices, Constraint, GenerateRequest, JsonObject
from reference_server import ipc
from reference_server.config import Limits
from reference_server.frontend.validation import constraint_refusal, plan_generate

ENGINE = ipc.EngineInfo("m", "llama", 100, 64, [2], None, 4096, 8, True, True, None, 0, 0, True)
CAPS = Capabilities(text_input=True, max_outputs=4, constrained_decoding=True)


def plan(constraint: Constraint, caps: Capabilities = CAPS) -> ipc.Constraint | None:
    return plan_generate(GenerateRequest(text="x", constraint=constraint), caps, Limits(), ENGINE).constraint


def test_each_member_becomes_the_engines_constraint() -> None:
    assert plan_generate(GenerateRequest(text="x"), CAPS, Limits(), ENGINE).constraint is None
    assert plan(Constraint(json_schema="{}")) == ipc.Constraint("json_schema", "{}")
    assert plan(Constraint(json_object=JsonObject())) == ipc.Constraint("json_object")
    assert plan(Constraint(regex="")) == ipc.Constraint("regex", "")  # the empty text: compiles
    assert plan(Constraint(ebnf='root ::= "a"')) == ipc.Constraint("ebnf", 'root ::= "a"')
    choice = Constraint(choice=Choices(choices=["a", "b"]))
    assert plan(choice) == ipc.Constraint("choice", choices=("a", "b"))


@pytest.mark.parametrize(
    ("constraint", "status", "names"),
    [
        (Constraint(regex="a"), Status.UNIMPLEMENTED, "constraint"),  # to a server without the capability
        (Constraint(), Status.INVALID_ARGUMENT, "constraint: exactly one of"),
        (Constraint(choice=Choices()), Status.INVALID_ARGUMENT, "constraint.choice"),
        (
            Constraint(choice=Choices(choices=["a", ""])),
            Status.INVALID_ARGUMENT,
            "constraint.choice.choices[1]",
        ),
    ],
)
def test_a_constraint_of_the_wrong_shape_is_refused(
    constraint: Constraint, status: Status, names: str
) -> None:
    caps = Capabilities(text_input=True, max_outputs=4) if status == Status.UNIMPLEMENTED else CAPS
    with pytest.raises(GRPCError) as refused:
        plan(constraint, caps)
    assert refused.value.status == status and names in (refused.value.message or "")


def test_a_refusal_names_the_field_and_a_bounded_value() -> None:
    long = ipc.Constraint("regex", "a(" + "b" * 200)
    message = constraint_refusal(long, "constraint.regex", "does not parse: x").message or ""
    assert message.startswith("constraint.regex='a(bbb") and message.endswith("...' does not parse: x")
    assert len(message) < 120
    assert constraint_refusal(
        ipc.Constraint("json_object"), "constraint.json_object", "does not compile: y"
    ).message == ("constraint.json_object does not compile: y")
