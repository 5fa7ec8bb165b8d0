"""Ray Serve in front of Triton, as its documentation shows it: one deployment whose
``@serve.batch`` method makes one gRPC call to Triton per batch (``common.Triton``).

* A local Ray cluster (``ray.init``, no dashboard, workers' output to Ray's log files, not the
  terminal); Serve's HTTP ingress on ``--host:--port`` (``serve.start(http_options=...)``); the
  app at ``route_prefix="/predict"``; on SIGTERM Serve, then Ray, shut down:
  https://docs.ray.io/en/latest/serve/api/running.html
* ``num_replicas=--workers`` (a replica is a process, as a gateway worker); ``__call__`` takes
  Starlette's request (https://docs.ray.io/en/latest/serve/http-guide.html) and awaits the
  batched method, one batch at a time per replica (Serve's default):
  https://docs.ray.io/en/latest/serve/advanced-guides/dyn-req-batch.html
* ``max_batch_size`` and ``batch_wait_timeout_s`` come from the command line: they reach the
  replicas as ``user_config``, which ``reconfigure`` applies with the batch handler's setters
  (https://docs.ray.io/en/latest/serve/api/doc/ray.serve.batch.html).
* ``max_ongoing_requests`` (default 5) caps what a replica holds, hence its batches (Serve warns
  below ``max_batch_size``): 2x lets the next batch fill while one is at Triton.
* The Triton client is made in ``__init__``, which Serve runs on the replica's event loop (so
  ``grpc.aio`` binds to it; Ray's workers run uvloop), and closed in ``async __del__``, which
  Serve awaits when it stops a replica.
* Serve's high-throughput mode (Ray 2.55+): HAProxy as the HTTP ingress and each replica
  serving HTTP itself, instead of a Python proxy actor that costs about four times the CPU per
  request here. Environment variables, set unless the caller set them (both ``=0``: the
  default proxy):
  https://docs.ray.io/en/latest/cluster/kubernetes/user-guides/kuberay-serve-high-throughput.html
* No access log per request (``enable_access_log=False``), as Ferry's gateway by default:
  https://docs.ray.io/en/latest/serve/monitoring.html
* Replicas import ``loadtest.peers.common`` by name: Ray puts the driver's working directory
  (the repository root) on its workers' ``sys.path``, and they inherit ``PYTHONPATH``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from typing import Any

import ray
from ray import serve
from starlette.requests import Request

from loadtest.peers.common import PREDICT_PATH, PeerArgs, Triton, parse

NO_ACCESS_LOG = {"enable_access_log": False}
HIGH_THROUGHPUT = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
                   # on shutdown, no load balancer outside Ray to drain a replica from (30 s)
                   "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}
SHUTDOWN_S = 5.0  # Serve stops in ~2 s; after a SIGTERM to our process group Ray is gone anyway


@serve.deployment
class Predictor:
    """One replica: HTTP requests in, batches of their texts to Triton."""

    def __init__(self, triton_url: str, model: str) -> None:
        self.triton = Triton(triton_url, model)

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.predict.set_max_batch_size(config["max_batch_size"])
        self.predict.set_batch_wait_timeout_s(config["batch_wait_timeout_s"])

    @serve.batch
    async def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        return await self.triton.infer_batch(texts)

    async def __call__(self, request: Request) -> dict[str, Any]:
        text: str = (await request.json())["input"]
        answer: dict[str, Any] = await self.predict(text)
        return answer

    async def __del__(self) -> None:
        await self.triton.close()


def start(args: PeerArgs) -> None:
    for name, value in HIGH_THROUGHPUT.items():  # read by Serve's actors, which inherit them
        os.environ.setdefault(name, value)
    ray.init(num_cpus=max(os.cpu_count() or 1, args.workers), include_dashboard=False,
             log_to_driver=False)
    serve.start(http_options={"host": args.host, "port": args.port},
                logging_config=NO_ACCESS_LOG)
    batching = {"max_batch_size": args.max_batch, "batch_wait_timeout_s": args.max_wait_s}
    replicas = Predictor.options(  # type: ignore[attr-defined]  # a Deployment, decorated
        num_replicas=args.workers, max_ongoing_requests=2 * args.max_batch, user_config=batching)
    serve.run(replicas.bind(args.triton, args.model), route_prefix=PREDICT_PATH,
              logging_config=NO_ACCESS_LOG)


def main() -> None:
    args = parse(description=__doc__.splitlines()[0])
    start(args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which sets its own
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    asyncio.run(stop_serve())
    ray.shutdown()


async def stop_serve() -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(serve.shutdown_async(), SHUTDOWN_S)


if __name__ == "__main__":
    main()
