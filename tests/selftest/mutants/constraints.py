"""Mutants of constrained decoding (CONSTRAIN-*), each a way servers have lost a constraint: dropped
for some requests, refused with the wrong code, or an invalid one quietly run unconstrained."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from grpclib import GRPCError, Status

from lmrpc.v1 import Constraint, GenerateRequest, GenerateResponse

from .base import Mutant
from .control_rpcs import RequestRewrite


class ConstraintDroppedForN(RequestRewrite):
    name = "constraint-dropped-for-n"
    fault = "the constraint of a request of several outputs is dropped (only output 0's path keeps it)"
    expected = frozenset({"CONSTRAIN-1[*]", "CONSTRAIN-3[n=4]"})

    def edit(self, request: GenerateRequest) -> None:
        if request.sampling is not None and (request.sampling.n or 1) > 1:
            request.constraint = None


class ChoicesJoinedUnescaped(RequestRewrite):
    name = "choices-joined-unescaped"
    fault = "a choice is run as the regex of its strings joined by | unescaped ('a.c' admits 'abc')"
    expected = frozenset({"CONSTRAIN-1[choice-literal]"})

    def edit(self, request: GenerateRequest) -> None:
        choice = request.constraint.choice if request.constraint is not None else None
        if choice is not None and choice.choices and all(choice.choices):  # validated first, then joined
            request.constraint = Constraint(regex="(" + "|".join(choice.choices) + ")")


class ConstraintDroppedForFinalOnly(RequestRewrite):
    name = "constraint-dropped-for-final-only"
    fault = "the constraint is dropped when the client asks for final_only (the unary path forgets it)"
    expected = frozenset({"CONSTRAIN-3[n=4]"})

    def edit(self, request: GenerateRequest) -> None:
        if request.response is not None and request.response.final_only:
            request.constraint = None


class ConstraintYieldsToIgnoreEos(RequestRewrite):
    name = "constraint-yields-to-ignore-eos"
    fault = "with ignore_eos the constraint is dropped (the engine keeps generating past a complete text)"
    expected = frozenset({"CONSTRAIN-3[ignore_eos]"})

    def edit(self, request: GenerateRequest) -> None:
        if request.stopping is not None and request.stopping.ignore_eos:
            request.constraint = None


class InvalidConstraintAsInternal(Mutant):
    name = "invalid-constraint-as-internal"
    fault = "a constraint that does not compile fails the call with INTERNAL (the compiler's exception)"
    expected = frozenset({"CONSTRAIN-2[*]", "CONSTRAIN-4[remote-ref]", "ERR-3"})

    async def upstream_events(
        self, request: GenerateRequest, deadline: Any
    ) -> AsyncGenerator[GenerateResponse]:
        try:
            async for event in super().upstream_events(request, deadline):
                yield event
        except GRPCError as exc:
            if request.constraint is not None and exc.status is Status.INVALID_ARGUMENT:
                raise GRPCError(Status.INTERNAL, "grammar compilation failed") from None
            raise


class InvalidConstraintRunsFree(Mutant):
    name = "invalid-constraint-runs-free"
    fault = "a constraint that does not compile is dropped and the request runs unconstrained"
    expected = frozenset({"CONSTRAIN-2[*]", "CONSTRAIN-4[remote-ref]"})

    async def upstream_events(
        self, request: GenerateRequest, deadline: Any
    ) -> AsyncGenerator[GenerateResponse]:
        try:
            async for event in super().upstream_events(request, deadline):
                yield event
            return
        except GRPCError as exc:
            if request.constraint is None or exc.status is not Status.INVALID_ARGUMENT:
                raise
        request.constraint = None
        async for event in super().upstream_events(request, deadline):
            yield event


CONSTRAINT_MUTANTS: tuple[type[Mutant], ...] = (
    ConstraintDroppedForN,
    ChoicesJoinedUnescaped,
    ConstraintDroppedForFinalOnly,
    ConstraintYieldsToIgnoreEos,
    InvalidConstraintAsInternal,
    InvalidConstraintRunsFree,
)
