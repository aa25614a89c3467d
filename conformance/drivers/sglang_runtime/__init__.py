"""``sglang.runtime.v1.SglangService``, SGLang's native gRPC service (the one every SGLang process
serves beside HTTP), as the harness drives it.

It is a *server-side tokenizer* protocol: ``TextGenerate`` takes text and ``Generate`` token ids,
and the server matches stop strings itself. The driver sends every request through ``Generate``
(token ids out, which every check needs); a text prompt is first tokenized with the server's own
``Tokenize``, the ids ``TextGenerate`` would run. Its semantics, as SGLang's clients rely on them:

- responses are *cumulative* unless ``GetServerInfo`` declares ``incremental_streaming_output``:
  every response of an output carries all of its ids so far, each extending the last (SRT-1);
  declared deltas carry only new ids;
- ``meta_info`` is a map of JSON texts: ``id``, ``index`` (which output, where n > 1),
  ``prompt_tokens``, ``completion_tokens`` (the output's so far), ``cached_tokens`` and
  ``finish_reason`` (null until the output ends, then ``{"type": ..., "matched": ...}``) (SRT-2);
- an output's last response is the only one with a finish reason, and it says ``finished``
  (SRT-3);
- ``Abort`` takes one ``rid`` or ``abort_all`` and its ``success`` says nothing per id; an aborted
  stream ends in-band, every unfinished output finishing "abort" (SRT-4).

The breaks of those rules that leave no trace in the normalised events are findings of the SRT
clauses (contract §15); the rest is judged by the lmrpc.v1 clauses through this protocol's
profile. There is no seed, no chat input (chat is the OpenAI pass-through, ``ChatComplete``) and
no advertised capability: what the server promises beyond the protocol comes from ``--assume``.

lmrpc.v1's ``Embed`` is ``OpenAIEmbed`` (a batch of texts, as ``/v1/embeddings`` takes it): its
``data`` in the order listed, its ``usage.prompt_tokens``; an in-band ``status_code`` other than
200 is read as the gRPC status of that HTTP status (400 INVALID_ARGUMENT, ...). The server embeds
exactly when OpenAIEmbed answers a text (discovery asks once: SGLang serves one model, and an
embedding request to a generation model is a 400).
``TextEmbed``, ``Embed``, ``Score``, ``Rerank`` and the administration RPCs are read natively by
the sglang-runtime cases (``cases/sglang_runtime_*.py``), which call them through ``stub`` and
``openai_json``.
"""

from conformance.drivers.sglang_runtime.driver import SERVICE, SglangRuntimeDriver
from conformance.drivers.sglang_runtime.json_answer import JsonAnswer, error_message
from conformance.drivers.sglang_runtime.reader import RuntimeReader

__all__ = ["SERVICE", "JsonAnswer", "RuntimeReader", "SglangRuntimeDriver", "error_message"]
