"""Injects the planned faults into the running stack, each at its time, and logs each one.

A gateway, batcher or Triton fault hits one ready process of its kind, picked at random (seeded):
SIGKILL or SIGTERM, after which the supervisor starts it again, or SIGSTOP and SIGCONT after the
planned pause. A Redis fault hits the master the sentinels name: killed or terminated, the
sentinels fail over to a replica, and the old master is started again once they have (they make
it a replica of the new one); stopped, it comes back after the pause to find itself demoted if
the sentinels failed over meanwhile. Faults run concurrently, one at a time per target.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from ferry.errors import StartupError
from ferry.stack.ports import LOOPBACK
from ferry.stack.redis_ha import RedisNode, SentinelGroup
from loadtest.soak.clock import Clock
from loadtest.soak.plan import Action, PlannedFault, Target
from loadtest.soak.stack import Service, SoakStack, send_signal

log = logging.getLogger("loadtest.soak")
SIGNALS = {Action.KILL: signal.SIGKILL, Action.TERM: signal.SIGTERM}
PICK_TIMEOUT_S = 20.0  # a fault waits this long for a ready target (one back from a fault)
RECOVER_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 20.0
REPLACED_EXTRA_S = 2.0  # past the replicas' move, so that the write guard's lag has passed


@dataclass
class FaultEvent:
    planned_s: float
    kind: str
    at_s: float | None = None
    ended_s: float | None = None
    name: str = ""
    pid: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


class FaultInjector:
    def __init__(self, stack: SoakStack, plan: list[PlannedFault], clock: Clock,
                 seed: int, redis_stop_s: float | None = None) -> None:
        self.stack = stack
        self.redis_stop_s = redis_stop_s  # None: until the sentinels have replaced the master
        self.plan = plan
        self.clock = clock
        self.rng = random.Random(seed)
        self.events: list[FaultEvent] = []
        self._locks = {target: asyncio.Lock() for target in Target}

    async def run(self) -> None:
        """Inject every planned fault at its time; return when all have ended."""
        started: list[asyncio.Task[None]] = []
        try:
            for fault in self.plan:
                await self.clock.sleep_until(fault.at_s)
                started.append(asyncio.create_task(self._inject(fault)))
            await asyncio.gather(*started)
        finally:
            for task in started:
                task.cancel()
            await asyncio.gather(*started, return_exceptions=True)

    async def _inject(self, fault: PlannedFault) -> None:
        event = FaultEvent(fault.at_s, fault.kind.name)
        self.events.append(event)
        async with self._locks[fault.kind.target]:
            try:
                if fault.kind.target is Target.REDIS:
                    await self._redis(fault, event)
                else:
                    await self._service(fault, event)
            except (StartupError, OSError) as exc:
                event.details["error"] = str(exc)[:300]
            event.ended_s = round(self.clock.now(), 2)
        log.info("[%7.2fs] fault %s on %s (pid %s): %s", event.at_s or self.clock.now(),
                 event.kind, event.name or "-", event.pid, event.details)

    def _start(self, event: FaultEvent, name: str, pid: int | None) -> None:
        event.at_s, event.name, event.pid = round(self.clock.now(), 2), name, pid

    async def _pick(self, target: Target) -> Service | None:
        """A ready service of ``target``, waiting for one for at most PICK_TIMEOUT_S."""
        deadline = self.clock.now() + PICK_TIMEOUT_S
        while self.clock.now() < deadline:
            ready = await asyncio.to_thread(self._ready, target)
            if ready:
                return self.rng.choice(ready)
            await asyncio.sleep(0.25)
        return None

    def _ready(self, target: Target) -> list[Service]:
        return [s for s in self.stack.of(target) if s.ready()]

    async def _service(self, fault: PlannedFault, event: FaultEvent) -> None:
        service = await self._pick(fault.kind.target)
        if service is None or service.pid is None:
            event.details["skipped"] = f"no ready {fault.kind.target.value}"
            return
        pid = service.pid
        self._start(event, service.name, pid)
        if fault.kind.action is Action.STOP:
            await self._pause(pid, asyncio.sleep(fault.pause_s), service)
            event.details["stopped_s"] = fault.pause_s
            return
        # the process and its children (Triton's backend stubs), each started in a session
        # of its own: a stub left without its tritonserver would run on
        send_signal(pid, SIGNALS[fault.kind.action], group=True)
        back = await self._until(lambda: service.pid not in (None, pid) and service.ready(),
                                 RECOVER_TIMEOUT_S)
        event.details["back_after_s"] = back

    async def _pause(self, pid: int, until: Awaitable[Any],
                     service: Service | None = None) -> float:
        """SIGSTOP, ``until`` (a sleep, or a wait for what a stop brings about), SIGCONT
        (always, even if cancelled); how long it was stopped."""
        if service is not None:
            service.held = True
        start = self.clock.now()
        try:
            send_signal(pid, signal.SIGSTOP)
            await until
            return round(self.clock.now() - start, 2)
        finally:
            send_signal(pid, signal.SIGCONT)
            if service is not None:
                service.held = False

    async def _until(self, check: Callable[[], bool], timeout_s: float) -> float | None:
        """Seconds until ``check`` (run in a thread) passes; None if it did not in time."""
        start = self.clock.now()
        while self.clock.now() - start < timeout_s:
            if await asyncio.to_thread(check):
                return round(self.clock.now() - start, 2)
            await asyncio.sleep(0.2)
        return None

    async def _redis(self, fault: PlannedFault, event: FaultEvent) -> None:
        group = self.stack.group
        assert group is not None
        node = await asyncio.to_thread(master_node, group)
        if node is None or node.process is None:
            event.details["skipped"] = "the sentinels name no running master"
            return
        old = node.port
        self._start(event, f"redis-{old}", node.process.pid)
        if fault.kind.action is Action.STOP:
            assert node.process.pid is not None
            event.details["stopped_s"] = await self._pause(
                node.process.pid, self._replaced(group, old, event))
        else:
            await asyncio.to_thread(node.kill, SIGNALS[fault.kind.action])
            event.details["failover_s"] = await self._failover(group, old)
            await asyncio.to_thread(node.start)
        event.details["settled_after_s"] = await self._until(lambda: settled(group),
                                                             SETTLE_TIMEOUT_S)
        event.details["master"] = group.master_port()

    async def _replaced(self, group: SentinelGroup, old: int, event: FaultEvent) -> None:
        """A stopped master's pause: ``redis_stop_s``, or until the sentinels have promoted a
        replica and moved the other replicas to it, and REPLACED_EXTRA_S more (so that the
        replicas' last acknowledgements to the old master are older than the write guard's
        lag): the old master wakes up replaced."""
        if self.redis_stop_s is not None:
            await asyncio.sleep(self.redis_stop_s)
            return
        event.details["failover_s"] = await self._failover(group, old)
        event.details["replicas_moved_s"] = await self._until(
            lambda: replicas_follow(group, old), SETTLE_TIMEOUT_S)
        await asyncio.sleep(REPLACED_EXTRA_S)

    async def _failover(self, group: SentinelGroup, old: int) -> float | None:
        start = self.clock.now()
        try:
            await asyncio.to_thread(group.wait_failover, old, FAILOVER_TIMEOUT_S)
        except StartupError:
            return None
        return round(self.clock.now() - start, 2)


def master_node(group: SentinelGroup) -> RedisNode | None:
    """The node the sentinels name master, if it runs."""
    port = group.master_port()
    return next((n for n in group.nodes if n.port == port and n.running), None)


def role(port: int) -> list[Any]:
    """A node's ROLE reply ([] if it does not answer)."""
    client = redis.Redis(host=LOOPBACK, port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        reply: list[Any] = client.role()
        return reply
    except redis.RedisError:
        return []
    finally:
        client.close()


def replicas_follow(group: SentinelGroup, old: int) -> bool:
    """Whether the sentinels name a master other than ``old`` and every other running node
    is its replica, connected."""
    port = group.master_port()
    if port is None or port == old:
        return False
    others = [n.port for n in group.nodes if n.running and n.port not in (old, port)]
    return all(_follows(role(p), port) for p in others)


def _follows(reply: list[Any], master: int) -> bool:
    """Whether a ROLE reply is a connected replica's of ``master``."""
    return len(reply) >= 4 and reply[0] == b"slave" and reply[2] == master and (
        reply[3] == b"connected")


def settled(group: SentinelGroup) -> bool:
    """Whether the named master answers as one and every other running node as a replica."""
    port = group.master_port()
    roles = {n.port: n.role() for n in group.nodes if n.running}
    return port is not None and roles.get(port) == b"master" and all(
        role == b"slave" for p, role in roles.items() if p != port)
