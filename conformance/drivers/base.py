"""What a protocol driver gives the harness: the two seams where the wire protocol shows.

Cases speak lmrpc.v1 only: typed unary calls on ``ctx.control`` / ``ctx.inference`` and
Generate through ``ctx.open`` / ``ctx.generate``. A driver maps those onto one wire protocol:

- ``control`` / ``inference``: stubs with lmrpc.v1's methods and types (for lmrpc.v1 itself, the
  generated ones; for an engine protocol, adapters that call its RPCs and translate the answers);
- ``express``: the lmrpc.v1 request as the protocol can carry it (what a validator must judge:
  a text prompt becomes the token ids the driver sends, an option the protocol lacks is gone);
- ``events``: one Generate call, its native messages normalised into lmrpc.v1 events, following
  the protocol's own documented semantics, with the breaks that leave no trace in the events
  filed as findings;
- ``discover``: what the server says about itself, as lmrpc.v1's ServerInfo and ModelInfo.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar
from typing import Protocol as TypingProtocol

import betterproto2
from grpclib import GRPCError, Status
from grpclib.client import Channel

from conformance.stream.record import Finding
from conformance.stream.wire import Decoded
from conformance.vocabulary import TargetInfo
from lmrpc.v1 import (
    Choices,
    ControlServiceStub,
    EmbeddingModelInfo,
    GenerateRequest,
    InferenceServiceStub,
    ModelInfo,
    ServerInfo,
)

if TYPE_CHECKING:
    from betterproto2.grpclib.grpclib_client import MetadataLike

# What the harness asks of a protocol that states no limit of its own (every one but lmrpc.v1).
MAX_OUTPUTS = 4  # the protocols put no limit on n: the harness asks for at most this many
MAX_TOP_LOGPROBS = 5
MAX_STOP_STRINGS = 4
PROMISES = ("deterministic_greedy", "seeded_sampling", "prefix_cache")
DEADLINE_STATUSES = (Status.DEADLINE_EXCEEDED, Status.CANCELLED)  # how a call's own deadline ends it


@dataclass(frozen=True, slots=True)
class Promises:
    """What the server promises that its protocol cannot advertise (``--assume``): the
    ``Capabilities`` flags whose cases compare exact tokens or cached prompts."""

    deterministic_greedy: bool = False
    seeded_sampling: bool = False
    prefix_cache: bool = False

    @staticmethod
    def parse(names: list[str]) -> Promises:
        unknown = sorted(set(names) - set(PROMISES))
        if unknown:
            raise ValueError(f"--assume {','.join(unknown)}: the choices are {', '.join(PROMISES)}")
        return Promises(**{name: True for name in names})


def json_object(text: str, where: str) -> dict[str, Any]:
    """A JSON object a server sends as text (empty text is ``{}``). Anything else is a ValueError
    naming ``where``: a server's malformed answer is never read as "nothing said"."""
    try:
        value = json.loads(text) if text else {}
    except ValueError as exc:
        raise ValueError(f"{where} is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where} is not a JSON object: {text[:200]!r}")
    return value


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """How a run reaches its target, whatever the wire: the budgets, and what only some protocols
    read (promises where a protocol advertises nothing; the model and parallelism of an HTTP API)."""

    connect_s: float = 10.0
    call_s: float = 30.0
    idle_s: float = 10.0
    promises: Promises = field(default_factory=Promises)  # --assume
    model: str | None = None  # --model; default: the first the server lists
    parallel: int | None = None  # --parallel: what the server runs at once (None: it says, or it is measured)


class Target(TypingProtocol):
    """The server under test once connected, whatever its wire (a gRPC ``GrpcTarget`` in
    harness/target.py, an HTTP ``HttpTarget`` in drivers/openai/): what the session, the runner,
    the pace and the report ask of it. Nothing outside the targets asks which kind it is."""

    info: TargetInfo

    @property
    def protocol(self) -> str:
        """Its row's id (conformance.spec.protocols)."""

    @property
    def learns_refusals(self) -> bool:
        """Options it refuses by design are learned before the cases (harness/refusals.py): a
        protocol that advertises nothing, whose support was not learned another way."""

    async def alive(self, budget_s: float) -> tuple[bool, str]:
        """Whether it still serves, asked with a cheap call, never a generation; and what it said."""

    def paced(self, parallel: int | None) -> None:
        """What the pace measured it runs at once (None: fast enough that it was not measured)."""

    def report_fields(self) -> tuple[dict[str, object], dict[str, object]]:
        """What the report records of it beyond ServerInfo: (more of who it is, what was learned)."""

    async def aclose(self) -> None: ...


class Address(TypingProtocol):
    """Where a target is, before the run reaches it: ``host:port`` (harness/target.py's
    ``Endpoint``) or an HTTP API's URL (``OpenAIEndpoint``)."""

    async def ready(self, connect_s: float) -> tuple[bool, str]:
        """Whether it is ready to serve (``--wait``), and what it said."""

    async def connect(self, protocol_id: str, options: ConnectOptions) -> tuple[Target, str]:
        """The connected target of ``protocol_id`` (``auto``: detected), and what chose it."""


@dataclass(frozen=True, slots=True)
class Discovered:
    server: ServerInfo
    model: ModelInfo
    embedding: EmbeddingModelInfo | None
    kv_tokens_total: int  # 0 when the server does not say
    cache_block_tokens: int = 0  # the prefix cache's granularity where the protocol says (0: it does not)


class Driver(ABC):
    protocol: ClassVar[str]  # its row's id (conformance.spec.protocols)
    service: ClassVar[str]  # the fully qualified service the protocol's calls go to
    abort_outcomes: ClassVar[bool] = True  # Abort reports per-id outcomes (ABORTED / NOT_IN_FLIGHT)
    carries_text: ClassVar[bool] = True  # outputs' text is on the wire (else only their token ids)
    announces_acceptance: ClassVar[bool] = False  # a first message (PromptInfo) before any token
    instance_field: ClassVar[str] = ""  # what names the running instance (SVC-4); "" where only uptime does
    field_names: ClassVar[Mapping[str, str]] = MappingProxyType(
        {}
    )  # lmrpc.v1 field -> the protocol's name for it (ERR-3)
    # a refused constraint's status names its field (ERR-3): lmrpc.v1's promise; an engine protocol
    # relays its grammar compiler's own words
    names_constraint_fields: ClassVar[bool] = True

    def express(self, request: GenerateRequest) -> GenerateRequest:
        """The request as this protocol carries it (the record keeps this one)."""
        return request

    def decode(self, token_ids: list[int]) -> str | None:
        """Token ids as text, special tokens skipped, where the driver holds the server's tokenizer
        (None: ask the server's Detokenize, or the protocol carries text itself)."""
        return None

    @abstractmethod
    def events(
        self,
        channel: Channel,
        request: GenerateRequest,
        deadline_s: float | None,
        findings: list[Finding],
        metadata: MetadataLike | None = None,
    ) -> AsyncGenerator[Decoded]:
        """One Generate call for ``request`` (already expressed), as lmrpc.v1 events. Raises what
        grpclib raises (a status before the first message, a deadline, a reset)."""

    @abstractmethod
    def control(self, channel: Channel) -> ControlServiceStub: ...

    @abstractmethod
    def inference(self, channel: Channel) -> InferenceServiceStub: ...

    @abstractmethod
    async def discover(self, channel: Channel, timeout_s: float) -> Discovered: ...

    async def answers(self, channel: Channel, timeout_s: float) -> bool:
        """Whether the port serves this protocol (``--protocol auto``): the protocol's health
        check answers OK, as smg probes a worker. Raises only what the transport raises."""
        try:
            await self.probe(channel, timeout_s)
        except GRPCError:
            return False
        return True

    @abstractmethod
    async def probe(self, channel: Channel, timeout_s: float) -> None:
        """The cheap call ``answers`` makes: raises GRPCError where the protocol is not served."""


def constraint_of(request: GenerateRequest) -> tuple[str, Any] | None:
    """The request's constraint as (kind, value), or None; ``choice`` gives the list of strings."""
    if request.constraint is None:
        return None
    kind, value = betterproto2.which_one_of(request.constraint, "kind")
    if isinstance(value, Choices):
        return kind, list(value.choices)
    return (kind, value) if kind else None


JSON_OBJECT_SCHEMA = '{"type": "object"}'  # any JSON object, for protocols without a json_object kind
_REGEX_SPECIAL = re.compile(r"[\\.^$|?*+()\[\]{}]")


def choice_regex(choices: list[str]) -> str:
    """A regular expression that matches exactly one of ``choices`` (for protocols without a choice kind)."""
    return "(" + "|".join(_REGEX_SPECIAL.sub(r"\\\g<0>", c) for c in choices) + ")"
