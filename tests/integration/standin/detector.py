"""Stand-in for the TensorRT engine of deploy/triton/models/moderation_trt, for the test suite
(there is no GPU or TensorRT here): the same ONNX file run by onnxruntime on the CPU, behind the
same inputs and outputs, so the production ensemble runs on a real tritonserver end to end."""

import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import nudenet  # the wheel that carries the weights

        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        weights = os.path.join(os.path.dirname(nudenet.__file__), "320n.onnx")
        self.session = ort.InferenceSession(weights, options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "images").as_numpy()
            raw = self.session.run(["output0"], {"images": images})[0]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("output0", raw.astype(np.float32))]))
        return responses
