"""A model that does not batch (max_batch_size 0), for the client matrix
(tests/tensor_models.py): MATRIX INT64 [-1, 3] in, TRANSPOSED [3, -1] and its column SUMS [3]
out; the first dimension is the matrix's own, not a batch."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            matrix = pb_utils.get_input_tensor_by_name(request, "MATRIX").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TRANSPOSED", np.ascontiguousarray(matrix.T)),
                pb_utils.Tensor("SUMS", matrix.sum(axis=0, dtype=np.int64))]))
        return responses
