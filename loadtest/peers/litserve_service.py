"""LitServe peer: one Triton model behind ``POST /predict`` with LitServe's dynamic batching.

Written as LitServe's documentation shows it:

* a ``LitAPI`` with ``setup``/``decode_request``/``predict``/``encode_response``, batching set on
  the API (``max_batch_size``, ``batch_timeout``), the default ``batch``/``unbatch`` (a list of
  texts in, a list of answers out): https://lightning.ai/docs/litserve/api-reference/litapi and
  https://lightning.ai/docs/litserve/features/batching
* ``LitServer(accelerator="cpu", workers_per_device=--workers)``: the inference worker
  processes; ``run(num_api_servers=None)`` starts as many uvicorn API server processes as
  workers, the documented default ("recommended"):
  https://lightning.ai/docs/litserve/api-reference/litserver and
  https://lightning.ai/docs/litserve/how-tos/parallelism-types
* ``fast_queue=True``, which the docs advise above 100 requests/s (in 0.2.19 it has no effect:
  ``LitServer`` passes ``transport_config=`` to a model whose field is ``transport_type``, so
  answers travel through the multiprocessing manager's queues either way).
* ``restart_workers`` left at its default (``False``): with it, every request also sends a
  "started" message back through the manager, which halved throughput at 800 requests/s here; a
  worker that dies makes LitServe shut down (after a graceful wait of up to 30 s per API server).

LitServe 0.2.19 refuses ``enable_async=True`` with ``max_batch_size > 1`` ("Async batching is not
supported"), so ``predict`` is synchronous: each worker keeps one event loop (an
``asyncio.Runner``) for its ``tritonclient.grpc.aio`` client and runs a batch's one call on it.
Uvicorn serves with uvloop and httptools (both installed); LitServe has no telemetry. Logging is
at ``warning`` (the docs' production example), with no access log line per request.

LitServe makes ``decode_request``'s ``request`` annotation the FastAPI body type and
``encode_response``'s return annotation the response model, so this module does not use
``from __future__ import annotations``: a string annotation would turn the body into a query field.
"""

import asyncio
import signal
from typing import Any

import litserve as ls

from loadtest.peers.common import PeerArgs, Triton, parse


class TritonAPI(ls.LitAPI):
    """Decode ``{"input": text}``, send the batch of texts to Triton, answer each text's dict."""

    def __init__(self, args: PeerArgs) -> None:
        super().__init__(max_batch_size=args.max_batch, batch_timeout=args.max_wait_s)
        self.args = args

    def setup(self, device: str) -> None:
        self.runner = asyncio.Runner()
        self.triton = self.runner.run(self._connect())

    async def _connect(self) -> Triton:
        return Triton(self.args.triton, self.args.model)  # grpc.aio binds to the running loop

    def decode_request(self, request: dict[str, Any]) -> str:
        return str(request["input"])

    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        return self.runner.run(self.triton.infer_batch(texts))

    def encode_response(self, output: dict[str, Any]) -> dict[str, Any]:
        return output


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl+C, once: LitServer's graceful shutdown stops its API servers and workers."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main() -> None:
    args = parse(description=__doc__.splitlines()[0] if __doc__ else "")
    server = ls.LitServer(TritonAPI(args), accelerator="cpu", workers_per_device=args.workers,
                          fast_queue=True)
    signal.signal(signal.SIGTERM, _interrupt)
    server.run(host=args.host, port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
