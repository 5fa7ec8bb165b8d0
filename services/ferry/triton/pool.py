"""Every Triton server of the configuration, as one backend: a batch goes to a server with a free
instance of its model, a server that fails is taken out and probed back, one that leaves (its
name no longer resolves to it, or it answers not ready, as Triton does on SIGTERM) takes no new
batch and finishes its calls.

Each server's state is ``ready`` (it answers live), ``down`` (unreachable, stopping, or it
failed a call) or ``draining`` (gone from its name's answer, finishing Ferry's calls). Servers
are probed every ``probe_s`` and names looked up again every ``resolve_s``: a server added
behind a headless Service takes work within ``resolve_s + probe_s``.

Which server a batch goes to: the one its slot is on (``ON_ENDPOINT``, set by the batcher when
the slot came from the shared budget), else the ready server with the most room (instances of
the model less Ferry's calls there). A call that fails because its server went away (refused,
unreachable, stopping, or no longer serving the model while another does) takes the server out
and is sent once more, at once, to another: its tasks do not wait for a backoff, nor count as
a failure of the model.
Each server's instance counts come from its own model configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from ferry.errors import BackendError, TransientBackendError, UnknownModelError
from ferry.kept import Kept
from ferry.triton.base import InferenceBackend, Inferred, ModelSpec, instances_of
from ferry.triton.endpoints import Address, Lookup, Target, resolve

if TYPE_CHECKING:
    from ferry.tensors import Tensor
    from ferry.triton.oip import InferredTensors

log = logging.getLogger(__name__)
T = TypeVar("T")
# The server a batch's slot is on: set by the batcher for the batch's task (its context).
ON_ENDPOINT: ContextVar[str] = ContextVar("ferry_on_endpoint", default="")
COUNT_TTL_S = 30.0  # a server's instance count of a model is read again after this
READY_PROBE_S = 5.0  # a ready server is probed this often (one not ready every ``probe_s``)


class State(enum.Enum):
    READY = "ready"
    DOWN = "down"
    DRAINING = "draining"


@dataclass
class Endpoint:
    """One Triton server: its client, state, Ferry's calls at it and its instance counts."""

    address: Address
    backend: InferenceBackend
    state: State = State.DOWN  # until its first probe answers ready
    inflight: int = 0
    listed: bool = True  # in its target's last answer (False: leaving)
    counts: dict[str, tuple[float, int]] = field(default_factory=dict)  # model: (read at, n)

    @property
    def name(self) -> str:
        return self.address.name

    def instances(self, model: str) -> int | None:
        found = self.counts.get(model)
        return found[1] if found is not None else None


@dataclass
class PoolHooks:
    """What the pool tells its owner (the batcher's metrics): a call's rows on a server, its
    calls there now, and the servers' states when one changed."""

    on_call: Callable[[str, int], None] = lambda endpoint, rows: None
    on_inflight: Callable[[str, int], None] = lambda endpoint, calls: None
    on_change: Callable[[list[Endpoint]], None] = lambda endpoints: None


async def _lookup(host: str, port: int) -> list[tuple[int, str]]:
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=1)  # SOCK_STREAM
    return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in found]


class TritonPool:
    """The servers of ``targets`` as one ``InferenceBackend`` (see the module's docstring)."""

    def __init__(self, targets: Sequence[Target], make: Callable[[Address], InferenceBackend],
                 *, resolve_s: float = 2.0, probe_s: float = 1.0, lookup: Lookup = _lookup,
                 hooks: PoolHooks | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.targets = tuple(targets)
        self.make = make
        self.resolve_s = resolve_s
        self.probe_s = probe_s
        self.lookup = lookup
        self.hooks = hooks or PoolHooks()
        self.clock = clock
        self.endpoints: dict[str, Endpoint] = {}
        self.models: set[str] = set()  # models asked about: counted on a server that comes up
        self.fixed = False  # its servers were given, not looked up
        self._specs: Kept[str, ModelSpec] = Kept(COUNT_TTL_S, clock)  # model: its pool's spec
        self._watch: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, backend: InferenceBackend, name: str = "triton:0",
           hooks: PoolHooks | None = None) -> TritonPool:
        """One given server as a pool (never looked up; probed like any)."""
        host, _, port = name.rpartition(":")
        target = Target(host.strip("[]"), int(port) if port.isdigit() else 0)
        pool = cls([target], lambda address: backend, hooks=hooks)
        pool.fixed = True
        endpoint = Endpoint(Address(target, target.host), backend, State.READY)
        pool.endpoints[endpoint.name] = endpoint
        return pool

    # -- its life ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Look the targets up, probe every server once, and keep watching."""
        if not self.fixed:
            await self.refresh()
        else:
            for endpoint in self.endpoints.values():
                await endpoint.backend.start()
        await self.probe_all()
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_loop(), name="ferry-triton-pool")

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        for endpoint in list(self.endpoints.values()):
            await endpoint.backend.close()

    async def _watch_loop(self) -> None:
        """Look names up every ``resolve_s``; probe the servers that are not ready every
        ``probe_s``, the ready ones every ``READY_PROBE_S`` (a ready server that fails a call is
        taken out by the call: probing it often would cost every idle process a gRPC call a
        second)."""
        looked_up = probed = self.clock()
        named = not self.fixed and any(t.named for t in self.targets)
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                now = self.clock()
                if named and now - looked_up >= self.resolve_s:
                    looked_up = now
                    await self.refresh()
                everyone = now - probed >= READY_PROBE_S
                if everyone:
                    probed = now
                await self.probe_all(everyone)
            except Exception:  # a watch that dies would freeze the pool's view: log, go on
                log.exception("watching Triton's servers failed; trying again")

    async def refresh(self) -> None:
        """Look every named target up again: new servers join (down until probed ready), a
        server no longer in the answer leaves once its calls are done."""
        found: dict[str, Address] = {}
        for target in self.targets:
            try:
                found.update((a.name, a) for a in await resolve(target, self.lookup))
            except OSError as exc:  # DNS down: keep the servers we know of this target
                log.warning("cannot look up Triton at %s (%s); keeping its servers", target, exc)
                found.update((e.name, e.address) for e in self.endpoints.values()
                             if e.address.target == target)
        for name, address in found.items():
            if name not in self.endpoints:
                backend = self.make(address)
                await backend.start()
                self.endpoints[name] = Endpoint(address, backend)
                log.info("Triton server %s joined (%s)", name, address.target)
        for name, endpoint in self.endpoints.items():
            endpoint.listed = name in found
        await self._forget_left()

    async def _forget_left(self) -> None:
        for name, endpoint in list(self.endpoints.items()):
            if not endpoint.listed and endpoint.inflight == 0:
                del self.endpoints[name]
                await endpoint.backend.close()
                log.info("Triton server %s left", name)
                self._changed()

    async def probe_all(self, ready_too: bool = True) -> None:
        """Every server's liveness (``ready_too``: the ready ones' too), at once; a server that
        becomes ready has its instance counts read before it takes work."""
        endpoints = [e for e in self.endpoints.values()
                     if ready_too or e.state is not State.READY or not e.listed]
        answers = await asyncio.gather(*(self._probe(e) for e in endpoints))
        for endpoint, state in zip(endpoints, answers, strict=True):
            if state is State.READY and endpoint.state is not State.READY:
                await self._count_known(endpoint)
            self._set(endpoint, state)

    async def _probe(self, endpoint: Endpoint) -> State:
        """Ready while it answers live. Not ``server_ready``: with strict readiness one model
        that failed to load would take the server's every other model out. A Triton that is
        stopping (SIGTERM) answers neither, and refuses new calls while it finishes its own."""
        if not endpoint.listed:
            return State.DRAINING
        return State.READY if await endpoint.backend.server_live() else State.DOWN

    def _set(self, endpoint: Endpoint, state: State) -> None:
        if endpoint.state is not state:
            log.info("Triton server %s: %s -> %s", endpoint.name, endpoint.state.value,
                     state.value)
            endpoint.state = state
            self._changed()

    def _changed(self) -> None:
        self._specs.clear()  # instances summed over other servers now
        self.hooks.on_change(list(self.endpoints.values()))

    def take_out(self, endpoint: Endpoint, why: str) -> None:
        """A server failed a call: no work until a probe finds it ready again."""
        if endpoint.state is State.READY:
            log.warning("Triton server %s taken out: %s", endpoint.name, why)
        self._set(endpoint, State.DOWN)

    # -- what the batcher plans with ----------------------------------------------------------

    def ready(self) -> list[Endpoint]:
        return [e for e in self.endpoints.values() if e.state is State.READY]

    def limits(self, model: str) -> dict[str, int]:
        """Each ready server's instances of ``model`` (those whose count is known)."""
        return {e.name: n for e in self.ready() if (n := e.instances(model)) is not None}

    def instances(self, model: str) -> int:
        """The model's instances over every ready server (0: none known yet)."""
        return sum(self.limits(model).values())

    def pick(self, model: str, avoid: str = "") -> Endpoint | None:
        """The ready server with the most room for ``model`` (instances less Ferry's calls
        there), the least busy first, then any, on a tie; None when none is ready."""
        ready = [e for e in self.ready() if e.name != avoid]
        counted = [e for e in ready if e.instances(model) is not None]
        ready = counted or ready  # a server not counted yet may not serve the model yet
        if not ready:
            return None
        return max(ready, key=lambda e: ((e.instances(model) or 1) - e.inflight, -e.inflight,
                                         random.random()))  # a tie: any, not always the first

    async def count(self, model: str) -> dict[str, int]:
        """Each ready server's instances of ``model``, read from its configuration when not
        read in the last ``COUNT_TTL_S``."""
        self.models.add(model)
        now = self.clock()
        for endpoint in self.ready():
            read = endpoint.counts.get(model)
            if read is None or now - read[0] > COUNT_TTL_S:
                await self._count(endpoint, model)
        return self.limits(model)

    async def _count_known(self, endpoint: Endpoint) -> None:
        for model in sorted(self.models):
            await self._count(endpoint, model)

    async def _count(self, endpoint: Endpoint, model: str) -> None:
        try:
            backend = endpoint.backend
            count = await instances_of(backend, await backend.model_config(model))
        except BackendError as exc:  # not served there (yet): no slot of it there
            log.debug("no instance count of %s at %s: %s", model, endpoint.name, exc)
            endpoint.counts.pop(model, None)
            self._specs.drop(model)
            return
        known = endpoint.counts.get(model)
        if known is not None and known[1] != count:
            self._specs.drop(model)
        endpoint.counts[model] = (self.clock(), count)

    # -- InferenceBackend: what any server answers ---------------------------------------------

    def _order(self) -> list[Endpoint]:
        """The servers to ask about models: the ready ones first."""
        return sorted(self.endpoints.values(), key=lambda e: e.state is not State.READY)

    async def _ask(self, question: Callable[[InferenceBackend], Awaitable[T]]) -> T:
        """A question about models, to a ready server; one that is unreachable is taken out
        and the next asked."""
        failed: BackendError | None = None
        for endpoint in self._order():
            try:
                return await question(endpoint.backend)
            except TransientBackendError as exc:
                if exc.code != "UNAVAILABLE":
                    raise
                self.take_out(endpoint, str(exc))
                failed = exc
        raise failed or TransientBackendError(
            f"no Triton server found at {_targets(self.targets)}", code="UNAVAILABLE")

    async def server_ready(self) -> bool:
        return any([await e.backend.server_ready() for e in list(self.endpoints.values())])

    async def server_live(self) -> bool:
        """Whether any server answers (none: an outage, not a bad call); every server's state
        as the answers say."""
        await self.probe_all()
        return bool(self.ready())

    async def ready_models(self) -> list[str]:
        return await self._ask(lambda b: b.ready_models())

    async def model_spec(self, model: str, *, refresh: bool = False) -> ModelSpec:
        """The model's spec (from a ready server), its instances summed over every ready
        server; kept for ``COUNT_TTL_S`` (then refreshed in the background: ``ferry.kept``), or
        until a server comes, goes or changes state (a gateway asks for it with every
        request)."""
        async def fetch() -> ModelSpec:
            spec = await self._ask(lambda b: b.model_spec(model, refresh=refresh))
            total = sum((await self.count(model)).values())
            return replace(spec, instances=total or spec.instances)

        return await self._specs.get(model, fetch, fresh=refresh)

    async def server_metadata(self) -> dict[str, Any]:
        return await self._ask(lambda b: b.server_metadata())

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return await self._ask(lambda b: b.model_metadata(model, version))

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        return await self._ask(lambda b: b.model_config(model, version))

    async def model_ready(self, model: str, version: str = "") -> bool:
        return await self._ask(lambda b: b.model_ready(model, version))

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        return await self._ask(lambda b: b.model_statistics(model, version))

    # -- InferenceBackend: the calls ------------------------------------------------------------

    async def infer(self, spec: ModelSpec, payloads: Sequence[bytes],
                    version: str = "") -> Inferred:
        return await self._call(spec.name, len(payloads),
                                lambda backend: backend.infer(spec, payloads, version))

    async def infer_tensors(self, model: str, version: str, inputs: Sequence[Tensor],
                            outputs: Sequence[str] = (), request_id: str = ""
                            ) -> InferredTensors:
        rows = int(inputs[0].shape[0]) if inputs and inputs[0].shape else 1
        return await self._call(model, rows, lambda backend: backend.infer_tensors(
            model, version, inputs, outputs, request_id))

    def chosen(self, model: str) -> Endpoint | None:
        """The server for a batch of ``model``: its slot's, while ready; else the roomiest."""
        endpoint = self.endpoints.get(ON_ENDPOINT.get())
        if endpoint is not None and endpoint.state is State.READY:
            return endpoint
        return self.pick(model)

    async def _call(self, model: str, rows: int,
                    call: Callable[[InferenceBackend], Awaitable[T]]) -> T:
        endpoint = self.chosen(model)
        if endpoint is None:  # all out: one may be back before the next probe
            await self.probe_all()
            endpoint = self.chosen(model)
        if endpoint is None:
            raise TransientBackendError(f"infer {model!r}: no Triton server is ready "
                                        f"({self._states()})", code="UNAVAILABLE")
        try:
            return await self._on(endpoint, rows, call)
        except BackendError as exc:
            if isinstance(exc, UnknownModelError):
                self._specs.drop(model)  # read again: it may have been replaced
            if await self._serves(endpoint, model, exc):
                raise  # the model's own failure: the executor's to judge
            other = self.pick(model, avoid=endpoint.name)
            if other is None:
                raise
            log.info("infer %s x%d: %s failed (%s), sent to %s", model, rows, endpoint.name,
                     exc.code or type(exc).__name__, other.name)
            return await self._on(other, rows, call)

    async def _serves(self, endpoint: Endpoint, model: str, exc: BackendError) -> bool:
        """Whether ``endpoint`` still serves ``model`` after a call of it failed with ``exc``.
        Not when it is unreachable or stopping (Triton on SIGTERM answers 'Server exiting',
        then unloads its models): taken out. Not when it no longer knows the model while
        another server does: its count of the model is dropped."""
        if exc.code == "UNAVAILABLE" or not await endpoint.backend.server_live():
            self.take_out(endpoint, str(exc))
            return False
        if isinstance(exc, UnknownModelError) and any(
                e.instances(model) is not None for e in self.ready() if e is not endpoint):
            endpoint.counts.pop(model, None)
            self._specs.drop(model)
            return False
        return True

    async def _on(self, endpoint: Endpoint, rows: int,
                  call: Callable[[InferenceBackend], Awaitable[T]]) -> T:
        endpoint.inflight += 1
        self.hooks.on_call(endpoint.name, rows)
        self.hooks.on_inflight(endpoint.name, endpoint.inflight)
        try:
            return await call(endpoint.backend)
        finally:
            endpoint.inflight -= 1
            self.hooks.on_inflight(endpoint.name, endpoint.inflight)
            if not endpoint.listed and endpoint.inflight == 0:
                asyncio.get_running_loop().create_task(self._forget_left())

    def _states(self) -> str:
        return ", ".join(f"{e.name} {e.state.value}" for e in self.endpoints.values()) or "none"


def _targets(targets: Sequence[Target]) -> str:
    return ",".join(map(str, targets))
