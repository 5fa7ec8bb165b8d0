"""Three inputs of mixed datatypes, three outputs, for the client matrix (tests/tensor_models.py):
TOTAL (FP64 [1]) is each row's COUNTS + WEIGHTS + CODES summed, NEGATED is -COUNTS with INT32's
wraparound, ODD says which CODES are odd (BOOL, as long as CODES)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            counts = pb_utils.get_input_tensor_by_name(request, "COUNTS").as_numpy()
            weights = pb_utils.get_input_tensor_by_name(request, "WEIGHTS").as_numpy()
            codes = pb_utils.get_input_tensor_by_name(request, "CODES").as_numpy()
            total = (counts.astype(np.float64).sum(axis=1) + weights.sum(axis=1)
                     + codes.astype(np.float64).sum(axis=1))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TOTAL", total.reshape(-1, 1)),
                pb_utils.Tensor("NEGATED", np.negative(counts).astype(np.int32)),
                pb_utils.Tensor("ODD", (codes % 2 == 1).astype(np.bool_))]))
        return responses
