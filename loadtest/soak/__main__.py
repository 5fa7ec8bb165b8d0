"""Chaos soak: a whole Ferry stack under load and faults, every answer checked.

    .venv/bin/python -m loadtest.soak                      # 60 s at half the measured capacity
    .venv/bin/python -m loadtest.soak --duration-s 1800 --share 0.5 --out /tmp/soak.json
    .venv/bin/python -m loadtest.soak --rate 30 --fault-every-s 4.5 --drain-s 30 \
        --seed 1                                          # what tests/integration/test_soak.py runs
    .venv/bin/python -m loadtest.soak --faults stop-redis --fault-every-s 15 --rate 100

Ferry promises that an accepted request (202) is never lost. This command starts, on loopback,
real processes: a Redis master with two replicas watched by three sentinels
(``ferry.stack.redis_ha``), one Triton serving the ``sim`` model, and two ``ferry gateway`` and
two ``ferry batcher`` processes that find the master through the sentinels and wait for one
replica to confirm each admission (FERRY_REDIS_MIN_REPLICAS=1, FERRY_REDIS_WAIT_MS=500). Then:

- **load**: open-loop Poisson arrivals at ``--rate`` per second, or ``--share`` of the capacity a
  closed-loop calibration of ``--calibrate-s`` measures first, for ``--duration-s``, spread over
  every gateway. Each request has its own input (its correct sim answer is known: the input's
  SHA-256 and length) and its own Idempotency-Key; a 429, a 503 or no answer at all (connection
  error, or none in 3 s) is retried with the same key on the next gateway, with doubling backoff,
  at most 12 times and 30 s. Each accepted task is followed with long-polls (``?wait=10``) until
  its record is final.
- **faults**: about one every ``--fault-every-s`` (0: none), at seeded times (``--seed``), of every
  kind in turn (``--faults``, default all twelve): ``kill`` (SIGKILL), ``term`` (SIGTERM) and
  ``stop`` (SIGSTOP, then SIGCONT 2-4 s later) of a ``gateway``, a ``batcher``, ``triton`` and the
  ``redis`` master. Kinds are dealt from shuffled decks, so any run with twelve faults or more
  injects each kind (at ``--fault-every-s 4.5``, a 60 s run has twelve), never the same target
  twice in a row. A supervisor restarts an exited gateway, batcher or Triton after 1 s, as
  Kubernetes would; a killed or terminated Redis master is started again once the sentinels have
  failed over (they make it a replica). A stopped Redis master is continued once the sentinels
  have replaced it and moved the replicas to the new master, and 2 s more: it wakes up as a
  master nobody follows, until the sentinels demote it (about 10 s later); ``--redis-stop-s``
  continues it after a fixed time instead. Each fault is logged as it happens, with its time
  from the start of the load.
- **Redis settings** (defaults: as Ferry and ``ferry.stack.redis_ha`` ship them):
  ``--redis-socket-timeout-s`` is every Ferry process's FERRY_REDIS_SOCKET_TIMEOUT_S (10 s): a
  connection to a hung master is dropped, and the master looked up again, after that long.
  ``--redis-min-replicas-to-write N`` sets Redis's own ``min-replicas-to-write N`` (with
  ``min-replicas-max-lag 2``) on every node: a master without replicas refuses writes.
  A stopped master once lost thousands of tasks here: Ferry's connections to it outlived the
  stop, and what it admitted after it woke up was gone once it was demoted. Ferry now answers
  every admission its replicas did not confirm 503, and asks the sentinels again every 0.5 s.
- **drain**: after the load, at most ``--drain-s`` for every accepted task to end; then every
  task's record is read once more.
- **memory**: every process's RSS (from /proc) every ``--memory-every-s``.

The report (printed, and as JSON in ``--out``):

- ``submissions``: sent, accepted (202), refused for good after the retries (and why: Ferry
  answers ``503 unavailable`` while Triton is down, so a long Triton outage refuses work; a
  refused request was never accepted, so it is not lost), retries and their causes
  (``503 not_replicated``, ``ConnectionRefusedError``, ``TimeoutError``, ``429 backlog_full``...),
  and arrivals skipped because 5,000 requests were already being followed.
- ``results.finished``: accepted tasks by the first final status seen; ``failure_reasons``.
- ``results.lost``: accepted tasks with no final record by the end of the drain (missing, or
  still PENDING), or whose final record had gone (``vanished``) or was PENDING again
  (``reverted``) when read again at the end. ``lost_tasks`` says, for each (up to 20), every
  Redis node's copy of its record, its stream entry's pending state, its dead letter and its
  Idempotency-Key, and the faults around its life.
- ``results.wrong``: SUCCESS with another output than the sim model's for that input, FAILED or
  EXPIRED without a reason, or CANCELLED (the soak cancels nothing).
- ``results.duplicated``: tasks whose record read at the end is final but not the first final
  record seen (another finished_at, output or status): answered twice, as happens when a
  completion written to a master is lost in its failover and the task is run again. Reported,
  not failed on.
- ``faults``, ``fault_counts``, ``restarts``: what was injected, when, what it did (failover
  time, time until the process was back), and the supervisor's restarts.
- ``latency_per_minute``: p50/p99/max of submit (the scheduled send) -> first final answer seen,
  per minute of submission.
- ``memory``: every sample, and per process (a restarted process is a new series) the trend in
  MiB per minute past its first ``--warmup-s``; flat is expected once warm, except for Redis,
  which keeps every record for the run (its result TTL), and the soak itself, which keeps every
  request; the summary flags > 1 MiB/min. Judge leaks on long runs (``--duration-s 1800``).
- ``client_cpu_s``, ``startup_s``, ``elapsed_s``, ``state_dir``: the soak's own CPU (to tell a
  busy client from a slow stack), the stack's start-up, the whole run, and where the logs are.

Exit code 0 only if lost == 0 and wrong == 0; 1 otherwise; 2 for bad flags. The stack's logs
stay in ``--state-dir`` (default: a new temporary folder, printed at the start).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence

import uvloop

from loadtest.soak.config import parse_args
from loadtest.soak.report import summary
from loadtest.soak.run import soak


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    report = uvloop.run(soak(config))
    config.out.parent.mkdir(parents=True, exist_ok=True)
    config.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(summary(report), flush=True)
    print(f"report: {config.out}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
