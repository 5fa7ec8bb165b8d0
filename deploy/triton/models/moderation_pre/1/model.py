"""Moderation, step 1 of 3 (CPU): decode each encoded image of the batch and letterbox it to
320x320 RGB floats in [0, 1], channels first (the detector's input), with each image's original
[height, width] for step 3. The code is the local moderation model's: moderation_ops.py, copied
next to this file from services/ferry/model_repository/moderation/1/ when the image is built.
An image that does not decode fails the whole batch with a message naming it; Ferry isolates such
a request and its batch-mates still succeed."""

import importlib.util
import os

import triton_python_backend_utils as pb_utils


# moderation_ops.py, from this directory: the backend does not promise it on sys.path.
_SPEC = importlib.util.spec_from_file_location(
    "moderation_ops", os.path.join(os.path.dirname(os.path.abspath(__file__)), "moderation_ops.py"))
ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ops)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            items = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
            try:
                pixels, shapes = ops.prepare([bytes(item) for item in items])
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(str(exc))))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PIXELS", pixels), pb_utils.Tensor("SHAPE", shapes)]))
        return responses
