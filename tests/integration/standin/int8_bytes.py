"""INT8 and BYTES tensors, for the client matrix (tests/tensor_models.py): DOUBLED is NUMBERS
times two with INT8's wraparound (100 -> -56), REVERSED is each TEXT element's bytes reversed
(so UTF-8 text may come back as bytes that are not UTF-8)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            numbers = pb_utils.get_input_tensor_by_name(request, "NUMBERS").as_numpy()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            reversed_ = np.array([[bytes(e)[::-1] for e in row] for row in text], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("DOUBLED", (numbers * np.int8(2)).astype(np.int8)),
                pb_utils.Tensor("REVERSED", reversed_)]))
        return responses
