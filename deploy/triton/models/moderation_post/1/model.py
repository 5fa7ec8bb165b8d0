"""Moderation, step 3 of 3 (CPU): from the detector's raw output [22, 2100] per image (4 box
coordinates and 18 class scores per anchor), the detections above the score threshold after
per-class non-maximum suppression, boxes in the original image's pixels, one JSON object per
image. The code is the local moderation model's: moderation_ops.py, copied next to this file from
services/ferry/model_repository/moderation/1/ when the image is built."""

import importlib.util
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


# moderation_ops.py, from this directory: the backend does not promise it on sys.path.
_SPEC = importlib.util.spec_from_file_location(
    "moderation_ops", os.path.join(os.path.dirname(os.path.abspath(__file__)), "moderation_ops.py"))
ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ops)


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.score_threshold = float(params.get("score_threshold", {}).get("string_value", 0.25))
        self.iou_threshold = float(params.get("nms_iou_threshold", {}).get("string_value", 0.45))

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            shapes = pb_utils.get_input_tensor_by_name(request, "SHAPE").as_numpy()
            results = [ops.postprocess(raw[i], shapes[i], self.score_threshold,
                                       self.iou_threshold) for i in range(len(raw))]
            out = np.array([[json.dumps(r).encode()] for r in results], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DETECTIONS", out)]))
        return responses
