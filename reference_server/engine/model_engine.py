"""The real model engine: Llama on the token-slot KV pool, continuous batching, prefix cache."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from reference_server.cpu import cpu_id
from reference_server.engine.attention import create_attention_backend, resolve_backend
from reference_server.engine.attention.flashinfer import FlashInferBackend
from reference_server.engine.base import constrained_decoding_available
from reference_server.engine.batcher import Batcher, BatcherConfig, ScheduledChunk
from reference_server.engine.config import ModelEngineConfig
from reference_server.engine.cuda_graphs import DecodeGraphs
from reference_server.engine.embedding import SentenceEmbedder
from reference_server.engine.host_memory import keep_freed_memory, release_freed_memory
from reference_server.engine.kv_manager import KVManager
from reference_server.engine.kv_pool import KVPool, SlotTable
from reference_server.engine.model_runner import ModelRunner
from reference_server.engine.native.kernels import choose_isa, kernel_tuning
from reference_server.engine.native.model import NativeModel, unsupported_reason
from reference_server.engine.sampler import SampleRow, sample
from reference_server.engine.seeds import derive_seed
from reference_server.engine.sequence import RequestGroup, Sequence
from reference_server.engine.stopping import finish_after, suppressed_ids
from reference_server.ipc import (
    EngineInfo,
    EngineLoad,
    Finish,
    KvCacheEvent,
    SequenceOutput,
    SubmitRequest,
    TokenLogprob,
)
from reference_server.models.gguf_weights import load_gguf_blocks
from reference_server.models.llama import LlamaModel
from reference_server.models.loader import (
    PREPACK_BATCH_HINT,
    check_checkpoint_fits,
    load_config,
    load_llama,
    load_weights,
)
from reference_server.models.packed_linear import prepack_supported
from reference_server.models.source import ModelSource
from reference_server.models.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from reference_server.engine.constraints import Grammar

log = logging.getLogger("lmrpc.engine")

SLOT_TABLE_WIDTH_MULTIPLE = 256  # attention pads key lists; the table must cover the padding
HELD_ROWS_FACTOR = 2  # slot-table rows per running sequence: one for it, one for a held one


class ModelEngine:
    def __init__(self, config: ModelEngineConfig) -> None:
        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.device = config.torch_device()
        self.dtype = config.torch_dtype(self.device)
        if self.device.type == "cpu":
            keep_freed_memory()
        tokenizer = load_tokenizer(config.source)
        self.eos_token_ids = frozenset(tokenizer.eos_token_ids)
        self.bos_token_id = tokenizer.bos_token_id
        self._native_reason = self._why_not_native()
        self.model = load_llama(
            config.source,
            device=self.device,
            dtype=self.dtype,
            # the torch model runs q4_1 weights in torch's int4 kernel; the native kernels pack their own
            int4_weights=config.weights == "q4_1" and self._native_reason is not None,
            prepack=False,  # below, and only if the torch model runs the steps
        )
        mc = self.model.config
        self.max_context_tokens = min(mc.max_context_tokens, config.context_length or mc.max_context_tokens)
        backend = resolve_backend(config.attention_backend, self.device)
        pool = KVPool(
            num_slots=config.kv_tokens, num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim, dtype=self.dtype, device=self.device, kv_format=config.kv_cache,
        )  # fmt: skip
        width = -(-self.max_context_tokens // SLOT_TABLE_WIDTH_MULTIPLE) * SLOT_TABLE_WIDTH_MULTIPLE
        # Held requests (clients that stopped reading, FLOW-1) keep their rows, so the table has
        # as many again for them: a full set of held sequences never blocks the running ones.
        rows = config.max_running_sequences * HELD_ROWS_FACTOR
        table = SlotTable(max_rows=rows, max_context_tokens=width, device=self.device)
        native = None if self._native_reason is not None else self._native_model(self.model, pool, table)
        if native is not None:
            self.model.release_weights()
        release_freed_memory()
        if native is None and prepack_supported(self.device, self.dtype):
            self.model.prepack_weights(PREPACK_BATCH_HINT)
        self.kv = KVManager(pool, table, config.kv_event_block_size)
        self.attention = create_attention_backend(
            backend, pool, table, num_heads=mc.num_heads, num_kv_heads=mc.num_kv_heads, head_dim=mc.head_dim,
        )  # fmt: skip
        graphs = None if native is not None else self._decode_graphs(self.model)
        self.runner = ModelRunner(self.model, table, self.attention, native, graphs)
        self.batcher = Batcher(BatcherConfig(config.max_batch_tokens, config.max_running_sequences), self.kv)
        self.embedder = SentenceEmbedder(device=self.device) if config.load_embedding_model else None
        self._rejected: list[SequenceOutput] = []
        self._stuck = False  # the last step could neither run nor admit anything
        log.info(
            "model engine: %s on %s (%s, %s weights, %s KV), %s kernels, attention %s, %s, %d KV slots, "
            "%d threads",
            config.source.model_id, self.device, self.dtype, config.weights, config.kv_cache,
            f"native {native.isa}" if native else "torch",
            "native" if native else self.attention.name,
            "CUDA graphs for decode" if graphs else "no CUDA graphs", config.kv_tokens, torch.get_num_threads(),
        )  # fmt: skip

    # ── Engine protocol ─────────────────────────────────────────────────────────────────────

    def info(self) -> EngineInfo:
        c, mc, e = self.config, self.model.config, self.embedder
        return EngineInfo(
            model_id=c.source.model_id,
            architecture="llama",
            vocab_size=mc.vocab_size,
            max_context_tokens=self.max_context_tokens,
            eos_token_ids=sorted(self.eos_token_ids),
            bos_token_id=self.bos_token_id,
            kv_tokens_total=c.kv_tokens,
            max_running_sequences=c.max_running_sequences,
            prefix_cache=True,
            # verified on CPU (tests/model/test_engine_batching.py); CUDA GEMMs and flashinfer's
            # split-KV schedule change with the batch, so a GPU run does not claim it
            deterministic_greedy=self.device.type == "cpu",
            embedding_model_id=e.model_id if e else None,
            embedding_dimensions=e.dimensions if e else 0,
            embedding_max_tokens=e.max_tokens if e else 0,
            constrained_decoding=constrained_decoding_available(self.eos_token_ids),
        )

    def add_request(self, request: SubmitRequest, grammar: Grammar | None = None) -> None:
        group = RequestGroup.create(request, grammar)
        for seq in group.outputs:
            seq.generator = torch.Generator().manual_seed(
                derive_seed(request.sampling.seed, seq.output_index)
            )
        too_big = (
            len(request.prompt_ids) + request.num_outputs * request.stopping.max_tokens
            > self.config.kv_tokens
        )
        if request.num_outputs > self.config.max_running_sequences or too_big:
            # the frontend validates against info(); waiting would block every later request
            log.warning("request %s can never fit this engine; finishing it as aborted", request.rid)
            self._rejected += [
                SequenceOutput(request.rid, s.output_index, [], finish=Finish("aborted"))
                for s in group.outputs
            ]
            return
        self.batcher.add(group)
        self._stuck = False

    def abort_request(self, rid: str) -> list[SequenceOutput]:
        self._stuck = False
        rejected = [o for o in self._rejected if o.rid == rid]
        if rejected:
            self._rejected = [o for o in self._rejected if o.rid != rid]
            return rejected
        group = self.batcher.pop(rid)
        if group is None:
            return []
        outputs = [
            SequenceOutput(rid, s.output_index, [], finish=Finish("aborted")) for s in group.active_outputs()
        ]
        for seq in group.active_outputs():
            self.kv.release(seq)
        self.kv.finish_group(group)
        return outputs

    def finish_output(self, rid: str, output_index: int) -> None:
        self._stuck = False
        group = self.batcher.running.get(rid)
        if group is None or not group.forked or not 0 <= output_index < len(group.outputs):
            return
        seq = group.outputs[output_index]
        if not seq.finished:
            self.kv.release(seq)
            self._retire_if_done(group)

    def grant_tokens(self, rid: str, credit: int) -> None:
        self.batcher.grant(rid, credit)
        self._stuck = False

    def has_work(self) -> bool:
        return bool(self._rejected) or (self.batcher.has_runnable() and not self._stuck)

    def step(self) -> list[SequenceOutput]:
        results, self._rejected = self._rejected, []
        chunks = self.batcher.schedule()
        if not chunks:
            self._stuck = True
            return results
        running = self.batcher.running
        slots = self.kv.alloc([(running[c.seq.rid], c.num_tokens) for c in chunks])
        logits = self.runner.forward(chunks, slots)
        for chunk in chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
        rows, targets = self._sample_rows([c for c in chunks if c.samples])
        for (group, seq), sampled in zip(targets, sample(logits, rows), strict=True):
            results.append(self._append(group, seq, sampled.token_id, sampled.logprob))
        for group in {id(g): g for g, _ in targets}.values():
            self._retire_if_done(group)
        return results

    def load(self, *, paused: bool) -> EngineLoad:
        kv = self.kv
        return EngineLoad(
            running_sequences=self.batcher.num_admitted_sequences,
            waiting_sequences=self.batcher.num_waiting_sequences,
            kv_tokens_in_use=kv.pool.num_slots - kv.pool.num_free - kv.cache.evictable_size,
            kv_tokens_total=kv.pool.num_slots,
            kv_tokens_cached=kv.cache.evictable_size,
            paused=paused,
            requests_in_engine=len(self.batcher.waiting) + len(self.batcher.running),
        )

    def flush_cache(self) -> int:
        self._stuck = False
        return self.kv.flush()

    def drain_kv_events(self) -> list[KvCacheEvent]:
        return self.kv.drain_events()

    def embed(self, texts: list[str]) -> tuple[list[list[float]], list[int]]:
        if self.embedder is None:
            raise ValueError("this engine was started without an embedding model")
        return self.embedder.embed(texts)

    def update_weights(self, source: ModelSource) -> str:
        """New weights for the same model shape, between two steps. The checkpoint is loaded and
        checked off to the side (any failure leaves the served model as it was); then the model
        is swapped, the native kernels' packed copies are made afresh, and the prefix cache is
        retired (``KVManager.retire_cache``). Requests in flight go on: their next tokens come
        from the new weights, over the KV their earlier tokens computed with the old ones."""
        config, weights = load_weights(source)
        check_checkpoint_fits(self.model.config, config, weights)
        model = LlamaModel(config, self.dtype, self.device)
        model.load_hf_state_dict(
            weights, int4_weights=self.config.weights == "q4_1" and self.runner.native is None
        )
        model.eval()
        native = None
        if self.runner.native is not None:
            native = self._native_model(model, self.kv.pool, self.runner.table, source)
            model.release_weights()
        elif prepack_supported(self.device, self.dtype):
            model.prepack_weights(PREPACK_BATCH_HINT)
        self.model = self.runner.model = model
        self.runner.native = native
        # a captured graph reads the tensors it was captured with: the old weights
        self.runner.graphs = None if native is not None else self._decode_graphs(model)
        release_freed_memory()
        released = self.kv.retire_cache()
        in_flight = len(self.batcher.running) + len(self.batcher.waiting)
        log.info("weights replaced from %s (%d requests in flight go on with them)", source.path, in_flight)
        return (
            f"Updated the weights from {source.path}; {in_flight} request(s) in flight go on with them; "
            f"the prefix cache was reset ({released} cached KV tokens released)."
        )

    # ── internals ───────────────────────────────────────────────────────────────────────────

    def _why_not_native(self) -> str | None:
        """None when the native kernels run the steps; else why not (raised where they must run)."""
        c = self.config
        reason: str | None = "--kernels torch"
        if c.kernels != "torch":
            reason = unsupported_reason(
                load_config(c.source), self.device, self.dtype, c.weights, c.kv_cache, c.kernel_isa()
            )
        if reason is not None and c.kernels not in ("auto", "torch"):
            raise ValueError(f"kernels={c.kernels!r} cannot run here: {reason}")
        if reason is not None and c.weights == "int8":
            raise ValueError(f"int8 weights run only in the native kernels, which cannot run here: {reason}")
        if reason is not None and c.kv_cache == "int8":
            raise ValueError(
                f"kv_cache='int8' runs only in the native kernels, which cannot run here: {reason}"
            )
        if reason is not None:
            log.info("the torch model runs the steps: %s", reason)
        else:
            isa = choose_isa(c.kernel_isa())
            chosen = "chosen" if c.kernel_isa() is None else f"forced by kernels={c.kernels!r}"
            log.info("native kernels for %s: %s (%s), %s", cpu_id(), isa, chosen, kernel_tuning())
        return reason

    def _decode_graphs(self, model: LlamaModel) -> DecodeGraphs | None:
        """CUDA graphs for the torch model's decode steps, where they run (engine/cuda_graphs.py)."""
        if not self.config.cuda_graphs or not isinstance(self.attention, FlashInferBackend):
            return None
        return DecodeGraphs(model, self.attention, self.config.max_running_sequences)

    def _native_model(
        self, model: LlamaModel, pool: KVPool, table: SlotTable, source: ModelSource | None = None
    ) -> NativeModel:
        source = source or self.config.source
        stored = (
            load_gguf_blocks(source.path) if self.config.weights != "dense" and source.kind == "gguf" else {}
        )
        return NativeModel(model, pool, table, self.config.weights, stored, self.config.kernel_isa())

    def check_integrity(self) -> None:
        """Every KV slot is free, cached or owned by exactly one running output (tests call this)."""
        self.kv.check_integrity(list(self.batcher.running.values()))

    def _sample_rows(
        self, chunks: list[ScheduledChunk]
    ) -> tuple[list[SampleRow], list[tuple[RequestGroup, Sequence]]]:
        rows: list[SampleRow] = []
        targets: list[tuple[RequestGroup, Sequence]] = []
        for logits_row, chunk in enumerate(chunks):
            group = self.batcher.running[chunk.seq.rid]
            seqs = [chunk.seq]
            if not group.forked:  # the prompt is complete: every output samples from these logits
                self.kv.fork(group)
                seqs = group.outputs
            for seq in seqs:
                rows.append(self._sample_row(group, seq, logits_row))
                targets.append((group, seq))
        return rows, targets

    def _sample_row(self, group: RequestGroup, seq: Sequence, logits_row: int) -> SampleRow:
        request = group.request
        stopping = request.stopping
        masked = suppressed_ids(stopping, self.eos_token_ids, seq.num_output_tokens)
        return SampleRow(
            logits_row=logits_row,
            sampling=request.sampling,
            generator=seq.generator,
            prompt_ids=request.prompt_ids,
            output_ids=seq.output_ids,
            masked_ids=masked,
            top_logprobs=request.top_logprobs,
            allowed_tokens=None if seq.grammar is None else seq.grammar.allowed_tokens(),
        )

    def _append(
        self, group: RequestGroup, seq: Sequence, token_id: int, logprob: TokenLogprob | None
    ) -> SequenceOutput:
        seq.token_ids.append(token_id)
        if seq.grammar is not None:
            seq.grammar.accept(token_id)
        finish = self._finish(group.request, seq, token_id)
        if finish is not None:
            self.kv.release(seq)
        cached = None
        if not group.reported_cache:
            group.reported_cache = True
            cached = group.num_cached_prompt_tokens
        return SequenceOutput(
            group.rid, seq.output_index, [token_id], None if logprob is None else [logprob], finish, cached
        )

    def _finish(self, request: SubmitRequest, seq: Sequence, token_id: int) -> Finish | None:
        return finish_after(
            request.stopping,
            self.eos_token_ids,
            token_id,
            num_output_tokens=seq.num_output_tokens,
            num_tokens=seq.num_tokens,
            max_context_tokens=self.max_context_tokens,
            constraint_complete=seq.grammar is not None and seq.grammar.terminated,
        )

    def _retire_if_done(self, group: RequestGroup) -> None:
        if group.done:
            self.batcher.pop(group.rid)
            self.kv.finish_group(group)
