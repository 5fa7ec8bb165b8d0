"""Triton's example "simple" as a Python-backend model, for the tensor (OIP) tests: OUTPUT0 is
INPUT0 + INPUT1, OUTPUT1 is INPUT0 - INPUT1, FP32 [16] each, batches of up to 8 rows."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
