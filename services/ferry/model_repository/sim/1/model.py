"""Simulated GPU model for Ferry's tests and benchmarks.

One execution of B items takes ``fixed_ms + per_item_ms * B`` milliseconds, spent sleeping so that
it costs no CPU. B counts every item of every request in the execution: Ferry sends a batch as one
request of B items, and Triton's own dynamic batcher hands over several requests at once; both pay
one fixed cost per execution, as a GPU does per kernel launch. Each item's output is a JSON object
derived only from its own input bytes, so a client can check that it got the answer to its own
request.

Fault injection: an input that starts with ``poison`` makes its whole request fail, as a model that
crashes on one bad input would; Ferry must isolate that input and let its batch-mates succeed.

Versions: a parameter named ``<name>@<version>`` overrides ``<name>`` for that version (the same
model.py serves every version directory). Two more parameters make versions differ, for rollout
tests: ``fail`` = "1" fails every request; ``differ_every`` = N marks one input in about N (those
whose SHA-256 starts with a byte divisible by N) with ``"variant": true`` in its output.
"""

import hashlib
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

POISON_PREFIX = b"poison"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        version = str(args.get("model_version", ""))

        def param(name, default):
            for key in (f"{name}@{version}", name):
                if key in params:
                    return params[key].get("string_value", default)
            return default

        self.version = version
        self.fixed_s = float(param("fixed_ms", "5")) / 1000.0
        self.per_item_s = float(param("per_item_ms", "0.1")) / 1000.0
        self.fail = param("fail", "0") == "1"
        self.differ_every = int(param("differ_every", "0"))

    def execute(self, requests):
        batches = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().reshape(-1)
                   for r in requests]
        items = sum(len(b) for b in batches)
        time.sleep(self.fixed_s + self.per_item_s * items)
        return [self._respond(batch) for batch in batches]

    def _respond(self, items):
        if self.fail:
            return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                f"sim: version {self.version} fails every request"))
        if any(bytes(item).startswith(POISON_PREFIX) for item in items):
            return pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError("sim: poison input in batch"))
        out = np.array([[_describe(bytes(item), self.differ_every)] for item in items],
                       dtype=np.object_)
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)])


def _describe(data, differ_every=0):
    digest = hashlib.sha256(data).hexdigest()
    answer = {"sha256": digest, "length": len(data)}
    if differ_every and int(digest[:2], 16) % differ_every == 0:
        answer["variant"] = True
    return json.dumps(answer, sort_keys=True).encode()
