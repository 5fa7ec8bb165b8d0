"""Two inputs of two datatypes, for the statistics and perf_analyzer tests (tests/tensor_models.py):
SCALED is VALUES (FP32 [4]) doubled, TOTAL (FP32 [1]) each row's VALUES plus STEPS (INT32 [2])."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "VALUES").as_numpy()
            steps = pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()
            total = values.sum(axis=1) + steps.astype(np.float32).sum(axis=1)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SCALED", (values * 2).astype(np.float32)),
                pb_utils.Tensor("TOTAL", total.reshape(-1, 1).astype(np.float32))]))
        return responses
