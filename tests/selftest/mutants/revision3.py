"""Mutants of contract revision 3's RPCs: ListModels (MODELS-1), Score and Rerank (SCORE-1,
SCORE-2), the profiler (ADMIN-1) and UpdateWeights (ADMIN-2)."""

from __future__ import annotations

from typing import Any

from grpclib import GRPCError, Status

from lmrpc.v1 import ModelKind, StopProfileResponse, UpdateWeightsResponse

from .base import Mutant
from .unary import UnaryMutant


class EmbeddingModelUnlisted(UnaryMutant):
    name = "embedding-model-unlisted"
    fault = "ListModels leaves out the embedding model that Embed runs"
    expected = frozenset({"MODELS-1"})
    method = "list_models"

    def edit(self, reply: Any) -> Any:
        reply.models = [m for m in reply.models if m.kind != ModelKind.EMBEDDING]
        return reply


class ScoresReversed(UnaryMutant):
    name = "scores-reversed"
    fault = "Score answers the scores in reverse input order"
    expected = frozenset({"SCORE-1", "SCORE-2"})  # Rerank's scores no longer match Score's
    method = "score"

    def edit(self, reply: Any) -> Any:
        reply.scores = list(reversed(reply.scores))
        return reply


class RerankIgnoresTopN(Mutant):
    name = "rerank-ignores-top-n"
    fault = "Rerank returns every document whatever top_n says"
    expected = frozenset({"SCORE-2"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "rerank" and request.top_n:
            request.top_n = None
        return await super().unary(method, request)


class EmptyItemScored(Mutant):
    name = "empty-item-scored"
    fault = "Score scores an empty item (as a space) instead of refusing it"
    expected = frozenset({"SCORE-1[invalid]"})

    async def unary(self, method: str, request: Any) -> Any:
        if method == "score" and request.query:
            request.items = [item or " " for item in request.items]
        return await super().unary(method, request)


class RefusalAnsweredOk(Mutant):
    """Answers OK where the server refused ``method`` with ``refusal``: subclasses set both and
    ``answer``."""

    method = ""
    refusal = Status.OK

    def answer(self) -> Any:
        raise NotImplementedError

    async def unary(self, method: str, request: Any) -> Any:
        try:
            return await super().unary(method, request)
        except GRPCError as error:
            if method == self.method and error.status is self.refusal:
                return self.answer()
            raise


class IdleProfileStopAccepted(RefusalAnsweredOk):
    name = "idle-profile-stop-accepted"
    fault = "StopProfile with nothing recording answers OK with no trace instead of FAILED_PRECONDITION"
    expected = frozenset({"ADMIN-1"})
    method, refusal = "stop_profile", Status.FAILED_PRECONDITION

    def answer(self) -> Any:
        return StopProfileResponse()


class MissingWeightsAccepted(RefusalAnsweredOk):
    name = "missing-weights-accepted"
    fault = "UpdateWeights of a path that does not exist answers OK (and serves the old weights)"
    expected = frozenset({"ADMIN-2[refused-in-flight]", "ADMIN-2[refused]"})
    method, refusal = "update_weights", Status.NOT_FOUND

    def answer(self) -> Any:
        return UpdateWeightsResponse(weights_version="update-accepted")


class WeightsVersionStale(UnaryMutant):
    name = "weights-version-stale"
    fault = "ModelInfo.weights_version keeps the initial name after an UpdateWeights"
    expected = frozenset({"ADMIN-2[reload-unnamed]", "ADMIN-2[reload]"})
    method = "get_model_info"

    def edit(self, reply: Any) -> Any:
        reply.model.weights_version = "initial"
        return reply


REVISION_3_MUTANTS: tuple[type[Mutant], ...] = (
    EmbeddingModelUnlisted,
    ScoresReversed,
    RerankIgnoresTopN,
    EmptyItemScored,
    IdleProfileStopAccepted,
    MissingWeightsAccepted,
    WeightsVersionStale,
)
