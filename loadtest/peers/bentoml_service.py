"""BentoML peer: one Triton model behind ``POST /predict``, batched by BentoML's adaptive batching.

What a BentoML 1.4 user writes, as its documentation shows:

* a class Service (``@bentoml.service``) run by ``bentoml serve`` with ``workers`` serving
  processes, each with its own Triton client made in ``__init__`` and closed by an
  ``@bentoml.on_shutdown`` hook (https://docs.bentoml.com/en/latest/build-with-bentoml/services.html,
  .../build-with-bentoml/parallelize-requests.html, .../build-with-bentoml/lifecycle-hooks.html);
* the command line reaches the Service's decorators as template arguments (``bentoml serve
  --arg key=value``, ``bentoml.use_arguments``: .../build-with-bentoml/template-arguments.html):
  ``main`` execs ``bentoml serve`` in its own process, whose arbiter (circus) stops its workers
  on SIGTERM;
* one async batchable API (``@bentoml.api(batchable=True, max_batch_size=...)``:
  https://docs.bentoml.com/en/latest/get-started/adaptive-batching.html) that takes the list of
  texts and makes one Triton call per batch.

A batchable API takes a batch and answers a batch; the client here sends one text and wants its
one answer. The docs' way to serve single items is a wrapper Service calling the batchable one
through ``bentoml.depends``: one more HTTP hop and more processes (about 1.7 times the CPU per
request here), and in 1.4.40 its client closes its pooled session every 100 calls under the calls
in flight (500s unless ``runner_connection`` is raised; cf. bentoml/BentoML#5540, #5544). So the
batchable API is ``/predict`` itself and pydantic types adapt its JSON, BentoML's I/O types being
pydantic's (.../build-with-bentoml/iotypes.html): ``{"input": "<text>"}`` is a batch of one, and
the body is the one answer in the slice of the batch's answers BentoML hands each request.

BentoML's batch window is adaptive and has no setting: each worker's dispatcher holds requests
while a regression of recent waits and batch times says one more is worth waiting for, and has
one batch in flight at a time. ``max_latency_ms`` is no wait but a deadline: a queued request that
cannot be answered within it gets 503 (the docs' "Error handling"). Set to ``--max-wait-ms`` (50)
it refused 8% of the requests at 200/s and 92% at 800/s; so it is the request timeout (60 s, both
BentoML's defaults): a request is refused only when it would time out anyway, as neither Ferry nor
the other peers refuse late requests. ``--max-wait-ms`` has no BentoML counterpart.

Access logs are off (as Ferry's are by default); uvicorn runs on uvloop (installed, picked by
``loop="auto"``); ``BENTOML_DO_NOT_TRACK`` turns off usage tracking.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import bentoml
from pydantic import BaseModel, BeforeValidator

from loadtest.peers.common import PREDICT_PATH, Triton, parse

SERVICE = "loadtest.peers.bentoml_service:Predictor"
TIMEOUT_S = 60  # BentoML's default request timeout, and the batching deadline (see above)


def main() -> None:
    """Serve with ``bentoml serve`` in this process, the command line as template arguments."""
    args = parse(description=__doc__.splitlines()[0] if __doc__ else "")
    template = {"triton": args.triton, "model": args.model, "workers": args.workers,
                "max_batch": args.max_batch}
    argv = [sys.executable, "-m", "bentoml", "serve", SERVICE,
            "--host", args.host, "--port", str(args.port)]
    argv += [item for key, value in template.items() for item in ("--arg", f"{key}={value}")]
    os.environ["BENTOML_DO_NOT_TRACK"] = "True"
    os.execv(sys.executable, argv)  # noqa: S606 - argv is built here, never a shell


if __name__ == "__main__":  # before the Service: `bentoml serve` imports this module to build it
    main()


class Settings(BaseModel):
    """The command line, as ``bentoml serve --arg`` hands it to the arbiter and every worker."""

    triton: str
    model: str
    workers: int
    max_batch: int


settings = bentoml.use_arguments(Settings)


def one_answer(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """A request's slice of its batch's answers holds its one answer: the response body."""
    return answers[0]


def _body() -> Annotated[dict[str, Any], BeforeValidator(one_answer)]:
    raise NotImplementedError  # only its return type is used: the API's output spec


Texts = Annotated[list[str], BeforeValidator(lambda text: [text])]  # one text: a batch of one


@bentoml.service(workers=settings.workers, traffic={"timeout": TIMEOUT_S},
                 logging={"access": {"enabled": False}})
class Predictor:
    def __init__(self) -> None:
        self.triton = Triton(settings.triton, settings.model)

    @bentoml.api(route=PREDICT_PATH, batchable=True, max_batch_size=settings.max_batch,
                 max_latency_ms=TIMEOUT_S * 1000,
                 output_spec=bentoml.IODescriptor.from_output(_body))
    async def predict(self, input: Texts) -> list[dict[str, Any]]:  # noqa: A002
        return await self.triton.infer_batch(input)

    @bentoml.on_shutdown
    async def close(self) -> None:
        await self.triton.close()
