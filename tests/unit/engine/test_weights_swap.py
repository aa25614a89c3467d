"""What new weights do to the KV bookkeeping (KVManager.retire_cache) and which checkpoints fit
the served model (check_checkpoint_fits): no tensors of a real model needed."""

from __future__ import annotations

import pytest
import torch

from reference_server.engine.kv_manager import KVManager
from reference_server.engine.kv_pool import KVPool, SlotTable
from reference_server.engine.sequence import RequestGroup
from reference_server.ipc import (
    DetokenizeConfig,
    KvCacheCleared,
    SamplingConfig,
    StoppingConfig,
    SubmitRequest,
)
from reference_server.models.llama import LlamaConfig, hf_tensor_shapes
from reference_server.models.loader import CheckpointMismatchError, check_checkpoint_fits

CPU = torch.device("cpu")
GREEDY = SamplingConfig(0.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 0)
PROMPT = list(range(10, 26))  # one full 16-token block


def manager() -> KVManager:
    pool = KVPool(num_slots=128, num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32, device=CPU)
    return KVManager(pool, SlotTable(max_rows=8, max_context_tokens=64, device=CPU), kv_event_block_size=16)


def admitted(kv: KVManager, rid: str, n: int = 1) -> RequestGroup:
    stopping = StoppingConfig(4, 0, (), True)
    detokenize = DetokenizeConfig(True, True, (), False, 0)
    group = RequestGroup.create(SubmitRequest(rid, list(PROMPT), n, GREEDY, stopping, None, detokenize))
    assert kv.try_admit(group)
    return group


def prefill_and_fork(kv: KVManager, group: RequestGroup) -> None:
    """What a step does for the prompt: slots for its uncomputed tokens, then every output shares it."""
    lead = group.prefill_sequence
    start, end = lead.num_computed_tokens, len(PROMPT)
    slots = kv.alloc([(group, end - start)])
    assert lead.row is not None
    kv.table.write(torch.full((end - start,), lead.row), torch.arange(start, end), slots)
    lead.num_computed_tokens = end
    kv.fork(group)


def finish(kv: KVManager, group: RequestGroup) -> None:
    for seq in group.outputs:
        kv.release(seq)
    kv.finish_group(group)


def test_new_weights_retire_the_prefix_cache_until_the_requests_in_flight_end() -> None:
    kv = manager()
    earlier = admitted(kv, "earlier")
    prefill_and_fork(kv, earlier)
    finish(kv, earlier)
    in_flight = admitted(kv, "in-flight", n=2)
    assert in_flight.num_cached_prompt_tokens == len(PROMPT) - 1  # the earlier request's prefix
    prefill_and_fork(kv, in_flight)
    kv.drain_events()

    kv.retire_cache()
    assert kv.drain_events()[0] == KvCacheCleared()
    later = admitted(kv, "later")
    assert later.num_cached_prompt_tokens == 0  # nothing computed with the old weights is reused
    kv.check_integrity([in_flight, later])
    assert kv.retired  # the in-flight outputs still read their prompt's KV

    finish(kv, in_flight)
    assert not kv.retired and not kv.drain_events()  # the retired tree reports nothing
    prefill_and_fork(kv, later)
    finish(kv, later)
    kv.check_integrity([])
    assert kv.cache.evictable_size == len(PROMPT)  # only the new weights' KV stays cached


def tiny_config(**changes: int) -> LlamaConfig:
    values = {"num_layers": 1, "hidden_size": 8, "intermediate_size": 16, "num_heads": 2, "num_kv_heads": 1}
    return LlamaConfig(
        **{**values, **changes},
        head_dim=4,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        vocab_size=32,
        max_context_tokens=64,
        tie_embeddings=True,
    )


def checkpoint(config: LlamaConfig) -> dict[str, torch.Tensor]:
    shapes = hf_tensor_shapes(config)
    del shapes["lm_head.weight"]  # tied
    return {name: torch.zeros(shape) for name, shape in shapes.items()}


def test_a_checkpoint_of_the_served_shape_fits() -> None:
    served = tiny_config()
    check_checkpoint_fits(served, served, checkpoint(served))


def test_checkpoints_of_another_shape_are_refused_naming_the_difference() -> None:
    served = tiny_config()
    with pytest.raises(CheckpointMismatchError, match=r"hidden_size=16 \(served: 8\)"):
        check_checkpoint_fits(served, tiny_config(hidden_size=16), checkpoint(tiny_config(hidden_size=16)))
    broadcasts = checkpoint(served)
    broadcasts["model.norm.weight"] = torch.zeros(1)  # would broadcast into the norm silently
    with pytest.raises(CheckpointMismatchError, match=r"model.norm.weight has shape \(1,\)"):
        check_checkpoint_fits(served, served, broadcasts)
    missing = checkpoint(served)
    del missing["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(CheckpointMismatchError, match="missing"):
        check_checkpoint_fits(served, served, missing)
