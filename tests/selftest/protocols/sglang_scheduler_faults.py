"""The sglang-scheduler mutant zoo: the reference server's ``sglang.grpc.scheduler.SglangScheduler`` behind
a proxy with exactly one fault (engine_faults.py), each declaring the cases that must fail against
it, no more and no fewer. Controls are correct variants that must pass every case."""

from __future__ import annotations

from . import engine_faults as f
from .engine_proxy import SglangSchedulerProxy


class LastChunkLost(f.LastChunkLost, SglangSchedulerProxy):
    name = "sglang-last-chunk-lost"
    expected = frozenset(
        {
            "ABORT-1[mixed]",
            "ABORT-1[prefix-id]",
            "ABORT-2[mid-stream]",
            "ABORT-2[several-ids]",
            "ABORT-4[n=2]",
            "ABORT-4[n=4]",
            "FINISH-2",
            "N-1",
            "STOP-3",
            "STOP-3[n=2]",
            "STOP-5[default]",
            "STREAM-7",
            "STREAM-8[greedy]",
            "USAGE-5",
        }
    )
    # may also fail: SMG-2's sampled outputs are unseeded in SGLang (no seed field), so whether
    # one ends at EOS varies; whether a token precedes an Abort sent at acceptance or right after
    # the Generate is timing
    # FINISH-5 and STREAM-6[concurrent] too: which chunk is last (an EOS, a greedy tail) depends on
    # how the engine batched the steps and on unseeded sampling; so do the token counts of N-1[n=4]
    # and USAGE-6 (seen on a busy machine) and every SAMPLE case that compares two runs' outputs;
    # a min_tokens output's count falls under its minimum when its stop token came in a chunk of
    # several (STOP-5 with and without max_tokens, each seen once in CI on the vLLM twin of this fault)
    tolerated = f.COMPARES_RUNS | {
        "ABORT-2[before-first-token]",
        "ABORT-2[right-after-send]",
        "FINISH-5",
        "SMG-2[eos]",
        "N-1[n=2]",  # seen in the CI rehearsal with two busy loops beside it
        "N-1[n=4]",
        # a constrained output's text only when the lost chunk held its last characters (the chunks
        # a step makes depend on timing)
        "CONSTRAIN-1[choice]",
        "CONSTRAIN-1[choice-literal]",
        "CONSTRAIN-1[ebnf]",
        "CONSTRAIN-3[stop-string]",
    }


class CumulativeIds(f.CumulativeIds, SglangSchedulerProxy):
    name = "sglang-cumulative-ids"
    expected = frozenset(
        {
            "ABORT-1[mixed]",
            "ABORT-1[prefix-id]",
            "ABORT-2[mid-stream]",
            "ABORT-2[several-ids]",
            "ABORT-4[n=2]",
            "ABORT-4[n=4]",
            "CONSTRAIN-1[choice]",
            "CONSTRAIN-1[choice-literal]",
            "CONSTRAIN-1[ebnf]",
            "CONSTRAIN-1[json_object]",
            "CONSTRAIN-1[json_schema]",
            "CONSTRAIN-1[regex]",
            "CONSTRAIN-3[ignore_eos]",
            "CONSTRAIN-3[stop-string]",
            "FINISH-6[stop-at-max-tokens]",
            "STREAM-2",
            "STREAM-7",
            "STREAM-8[greedy]",
            "USAGE-5",
        }
    )
    # may also fail: whether two tokens precede an Abort sent at acceptance is timing
    tolerated = f.GROWS_WITH_TOKENS | {"ABORT-2[before-first-token]"}


class CompletionCountsPrompt(f.CompletionCountsPrompt, SglangSchedulerProxy):
    name = "sglang-completion-counts-prompt"
    expected = frozenset(
        {
            "ABORT-1[mixed]",
            "ABORT-1[prefix-id]",
            "ABORT-2[before-first-token]",
            "ABORT-2[mid-stream]",
            "ABORT-2[right-after-send]",
            "ABORT-2[several-ids]",
            "ABORT-4[n=2]",
            "ABORT-4[n=4]",
            "FINISH-2",
            "FINISH-6",
            "FINISH-6[ignore_eos]",
            "FINISH-6[stop-at-max-tokens]",
            "STREAM-7",
            "USAGE-5",
        }
    )


class PromptTokensPlusOne(f.PromptTokensPlusOne, SglangSchedulerProxy):
    name = "sglang-prompt-tokens-plus-one"
    expected = frozenset(
        {
            "USAGE-2",
        }
    )


class CachedTokensDropped(f.CachedTokensDropped, SglangSchedulerProxy):
    name = "sglang-cached-tokens-dropped"
    expected = frozenset(
        {
            "USAGE-6[long]",
            "USAGE-6[short]",
        }
    )


class DuplicateComplete(f.DuplicateComplete, SglangSchedulerProxy):
    name = "sglang-duplicate-complete"
    expected = frozenset(
        {
            "ABORT-1[mixed]",
            "ABORT-1[prefix-id]",
            "ABORT-2[before-first-token]",
            "ABORT-2[mid-stream]",
            "ABORT-2[right-after-send]",
            "ABORT-2[several-ids]",
            "FINISH-1",
            "FINISH-1[stateful]",
            "FINISH-3",
            "N-1[n=2]",
            "N-1[n=4]",
        }
    )


class LengthAsStop(f.LengthAsStop, SglangSchedulerProxy):
    name = "sglang-length-as-stop"
    expected = frozenset(
        {
            "FINISH-5",
            "FINISH-6",
            "FINISH-6[ignore_eos]",
        }
    )
    # may also fail: SMG-2's sampled outputs are unseeded in SGLang (no seed field), so whether
    # one hits max_tokens varies
    tolerated = frozenset({"SMG-2[eos]"})


class MatchedTokenOnLength(f.MatchedTokenOnLength, SglangSchedulerProxy):
    name = "sglang-matched-token-on-length"
    expected = frozenset(
        {
            "FINISH-5",
        }
    )


class IndexCollapsed(f.IndexCollapsed, SglangSchedulerProxy):
    name = "sglang-index-collapsed"
    expected = frozenset(
        {
            "ABORT-4[n=2]",
            "ABORT-4[n=4]",
            "FINISH-1",
            "FINISH-1[stateful]",
            "FINISH-2",
            "FINISH-3",
            "N-1",
            "N-1[n=2]",
            "N-1[n=4]",
            "SAMPLE-2[n]",
            "STOP-3[n=2]",
            "STREAM-2",
            "STREAM-7",
            "STREAM-8[greedy]",
            "USAGE-5",
        }
    )
    # may also fail: whether two greedy runs differ once their outputs' chunks share one index
    # depends on how the chunks interleave
    # the outputs' texts interleave under one index as the steps chunk them: a constrained text breaks
    # or not by timing
    tolerated = frozenset(
        {
            "SAMPLE-2",
            "CONSTRAIN-1[choice]",
            "CONSTRAIN-1[choice-literal]",
            "CONSTRAIN-1[ebnf]",
            "CONSTRAIN-1[json_object]",
            "CONSTRAIN-1[json_schema]",
            "CONSTRAIN-1[regex]",
        }
    )


class ErrorInBand(f.ErrorInBand, SglangSchedulerProxy):
    name = "sglang-error-in-band"
    expected = frozenset(
        {
            "ERR-2",
        }
    )
    # the fault fires on every request that asks for logprobs: any case that drew one may see it
    # (STREAM-8[greedy], SAMPLE-2, ... as their generated requests and timing fall)
    triggered_by = frozenset({"generate.return_logprobs"})


class LogprobsDropped(f.LogprobsDropped, SglangSchedulerProxy):
    name = "sglang-logprobs-dropped"
    expected = frozenset(
        {
            "STREAM-7",
        }
    )


class OneTokenPastMax(f.OneTokenPastMax, SglangSchedulerProxy):
    name = "sglang-one-token-past-max"
    expected = frozenset(
        {
            "FINISH-2",
            "STREAM-2",
            "STREAM-7",
            "STREAM-8[greedy]",
            "USAGE-5",
        }
    )


class AbortMissesOutputs(f.AbortMissesOutputs, SglangSchedulerProxy):
    name = "sglang-abort-misses-outputs"
    expected = frozenset(
        {
            "ABORT-4[n=2]",
            "ABORT-4[n=4]",
        }
    )
    # may also fail: whether the outputs the Abort missed end within the release budget is timing
    tolerated = frozenset({"ABORT-3[abort]", "SMG-3[abort]"})


class CancelNotPropagated(f.CancelNotPropagated, SglangSchedulerProxy):
    name = "sglang-cancel-not-propagated"
    expected = frozenset(
        {
            "CANCEL-1[after-first-response]",
            "SMG-3[cancel]",
        }
    )
    # may also fail: requests a reset left generating may still run when these read the load; a
    # reset right after the call begins can beat the request to the proxy, which then never
    # starts it; a deadline ends a call with a reset too, and whether the request it leaves running
    # outlasts CANCEL-2's release check is timing
    tolerated = frozenset(
        {"ABORT-3[abort]", "ABORT-3[stateful]", "CANCEL-1[after-begin]", "CANCEL-2[deadline]", "SMG-3[abort]"}
    )


class LoadStuckAfterEnd(f.LoadStuckAfterEnd, SglangSchedulerProxy):
    name = "sglang-load-stuck-after-end"
    expected = frozenset(
        {
            "CANCEL-1[after-first-response]",
            "SMG-3[abort]",
            "SMG-3[cancel]",
        }
    )
    # may also fail: they see the leak only when a cancel or abort ran before them, which --jobs
    # orders
    tolerated = frozenset({"ABORT-3[abort]", "ABORT-3[stateful]", "CANCEL-2[deadline]"})
    # a cancel right after the call began leaks only if the call reached the server before it
    triggered_by = frozenset({"scenario.cancel-after-begin"})


class LoadsHideRunning(f.LoadsHideRunning, SglangSchedulerProxy):
    name = "sglang-loads-hide-running"
    expected = frozenset(
        {
            "LOAD-1[active]",
            "LOAD-1[ground-truth]",
            "SMG-3[abort]",
            "SMG-3[cancel]",
        }
    )


class EosIdsWrong(f.EosIdsWrong, SglangSchedulerProxy):
    name = "sglang-eos-ids-wrong"
    expected = frozenset({"SMG-2[eos]"})
    # FINISH-5 sees it only when a pooled output ends at EOS, and SGLang's sampling has no seed
    tolerated = frozenset({"FINISH-5"})


class Unhealthy(f.Unhealthy, SglangSchedulerProxy):
    name = "sglang-unhealthy"
    expected = frozenset(
        {
            "SMG-4",
            "SMG-4[in-flight]",
        }
    )


class UnhealthyWhileBusy(f.UnhealthyWhileBusy, SglangSchedulerProxy):
    name = "sglang-unhealthy-while-busy"
    expected = frozenset(
        {
            "SMG-4[in-flight]",
        }
    )
    # may also fail: SMG-4 runs beside other cases, whose streams make this mutant unhealthy
    tolerated = frozenset({"SMG-4"})


class TokenizerDigestWrong(f.TokenizerDigestWrong, SglangSchedulerProxy):
    name = "sglang-tokenizer-digest-wrong"
    expected = frozenset(
        {
            "SMG-1",
        }
    )


class AbortAlwaysSucceeds(f.AbortAlwaysSucceeds, SglangSchedulerProxy):
    name = "sglang-abort-always-succeeds"
    expected = frozenset(
        {
            "ABORT-1[finished-then-reused]",
            "ABORT-1[finished]",
            "ABORT-1[mixed]",
            "ABORT-1[prefix-id]",
            "ABORT-1[twice-while-ending]",
            "ABORT-1[twice]",
            "ABORT-1[unknown]",
        }
    )


class RequestIdNotEchoed(f.RequestIdNotEchoed, SglangSchedulerProxy):
    name = "sglang-request-id-not-echoed"
    expected = frozenset(
        {
            "REQ-2",
        }
    )


class OneTokenChunks(f.OneTokenChunks, SglangSchedulerProxy):
    name = "sglang-one-token-chunks"
    is_control = True


class CompleteRepeatsAll(f.CompleteRepeatsAll, SglangSchedulerProxy):
    name = "sglang-complete-repeats-all"
    is_control = True


class KvClearedDropped(f.KvClearedDropped, SglangSchedulerProxy):
    name = "sglang-kv-cleared-dropped"
    expected = frozenset({"SMG-6[cleared]"})


class KvBlocksReversed(f.KvBlocksReversed, SglangSchedulerProxy):
    name = "sglang-kv-blocks-reversed"
    expected = frozenset({"SMG-6[stored]", "SMG-6[replay]", "SMG-6[cleared]"})


class AbortMatchesPrefix(f.AbortMatchesPrefix, SglangSchedulerProxy):
    name = "sglang-abort-matches-prefix"
    expected = frozenset({"ABORT-1[prefix-id]"})


class HealthCheckSlow(f.HealthCheckSlow, SglangSchedulerProxy):
    name = "sglang-health-check-slow"
    expected = frozenset({"SMG-4", "SMG-4[in-flight]"})


class ConstraintDropped(f.ConstraintDropped, SglangSchedulerProxy):
    name = "sglang-constraint-dropped"
    # SGLang's scheduler protocol has no choice kind (the driver sends a regex, so no empty choice
    # reaches it) and no seed (CONSTRAIN-3[n=4] skips)
    expected = f.CONSTRAINT_DROPPED - {
        "CONSTRAIN-2[constraint.choice=empty-string]",
        "CONSTRAIN-2[constraint.choice=none]",
        "CONSTRAIN-3[n=4]",
    }


SGLANG_SCHEDULER_MUTANTS: tuple[type[SglangSchedulerProxy], ...] = (
    LastChunkLost,
    CumulativeIds,
    CompletionCountsPrompt,
    PromptTokensPlusOne,
    CachedTokensDropped,
    DuplicateComplete,
    LengthAsStop,
    MatchedTokenOnLength,
    IndexCollapsed,
    ErrorInBand,
    LogprobsDropped,
    OneTokenPastMax,
    AbortMissesOutputs,
    CancelNotPropagated,
    LoadStuckAfterEnd,
    LoadsHideRunning,
    EosIdsWrong,
    Unhealthy,
    UnhealthyWhileBusy,
    TokenizerDigestWrong,
    AbortAlwaysSucceeds,
    RequestIdNotEchoed,
    OneTokenChunks,
    CompleteRepeatsAll,
    KvClearedDropped,
    KvBlocksReversed,
    AbortMatchesPrefix,
    HealthCheckSlow,
    ConstraintDropped,
)
