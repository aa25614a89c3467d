"""The models a server lists (MODELS-1): the generation model first, as GetModelInfo names it, the
embedding model exactly when Embed is served, adapters naming their base model."""

from __future__ import annotations

from conformance.harness.context import Ctx
from conformance.spec.registry import case
from lmrpc.v1 import ListModelsRequest, ModelKind, ServedModel


def _kind(model: ServedModel) -> str:
    return getattr(model.kind, "name", str(model.kind))


@case("MODELS-1", requires=("list_models",))
async def models_listed(ctx: Ctx) -> None:
    """Every entry once, with a kind; the one generation model first, with GetModelInfo's id and
    window; the embedding model exactly when Embed is served; adapters name the generation model."""
    models = list((await ctx.call(ctx.control.list_models, ListModelsRequest())).models)
    ids = [m.model_id for m in models]
    ctx.check.that(
        all(ids) and len(set(ids)) == len(ids), "ListModels' model_ids", "non-empty and each once", ids
    )
    kinds = [_kind(m) for m in models]
    ctx.check.that("UNSPECIFIED" not in kinds and bool(kinds), "ListModels' kinds", "each set", kinds)
    model = ctx.info.model
    ctx.check.equal(
        "the first entry (kind, model_id, max_input_tokens)",
        ("GENERATION", model.model_id, model.max_context_tokens),
        (kinds[0], models[0].model_id, models[0].max_input_tokens) if models else None,
    )
    ctx.check.equal("entries of kind GENERATION", 1, kinds.count("GENERATION"))
    embedding = ctx.info.embedding
    ctx.check.equal(
        "entries of kind EMBEDDING (model_id, max_input_tokens)",
        [(embedding.model_id, embedding.max_input_tokens)] if ctx.info.has("embed") and embedding else [],
        [(m.model_id, m.max_input_tokens) for m in models if m.kind == ModelKind.EMBEDDING],
    )
    ctx.check.equal(
        "base_model_id of each entry (the generation model's for an adapter, empty otherwise)",
        [model.model_id if m.kind == ModelKind.ADAPTER else "" for m in models],
        [m.base_model_id for m in models],
    )
