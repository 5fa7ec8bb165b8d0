"""Simulated GPU model for Ferry's tests and benchmarks.

One execution of B items takes ``fixed_ms + per_item_ms * B`` milliseconds, spent sleeping so that
it costs no CPU. B counts every item of every request in the execution: Ferry sends a batch as one
request of B items, and Triton's own dynamic batcher hands over several requests at once; both pay
one fixed cost per execution, as a GPU does per kernel launch. Each item's output is a JSON object
derived only from its own input bytes, so a client can check that it got the answer to its own
request.

Fault injection: an input that starts with ``poison`` makes its whole request fail, as a model that
crashes on one bad input would; Ferry must isolate that input and let its batch-mates succeed.
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
        self.fixed_s = float(params.get("fixed_ms", {}).get("string_value", "5")) / 1000.0
        self.per_item_s = float(params.get("per_item_ms", {}).get("string_value", "0.1")) / 1000.0

    def execute(self, requests):
        batches = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().reshape(-1)
                   for r in requests]
        items = sum(len(b) for b in batches)
        time.sleep(self.fixed_s + self.per_item_s * items)
        return [_respond(batch) for batch in batches]


def _respond(items):
    if any(bytes(item).startswith(POISON_PREFIX) for item in items):
        return pb_utils.InferenceResponse(
            output_tensors=[], error=pb_utils.TritonError("sim: poison input in batch"))
    out = np.array([[_describe(bytes(item))] for item in items], dtype=np.object_)
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)])


def _describe(data):
    digest = hashlib.sha256(data).hexdigest()
    return json.dumps({"sha256": digest, "length": len(data)}, sort_keys=True).encode()
