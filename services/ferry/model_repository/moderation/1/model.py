"""NudeNet 320n content-moderation detector behind Triton's Python backend.

Per request: one encoded image. The batch is decoded, letterboxed to 320x320, run through the
detector in a single onnxruntime call, and each image gets back a JSON object with its detections
(label, score, box as [x, y, width, height] in the original image's pixels) after per-class
non-maximum suppression. An image that does not decode fails the whole batch with a message naming
it; Ferry isolates such a request and its batch-mates still succeed. The pre- and post-processing
are in moderation_ops.py, shared with the production TensorRT ensemble (deploy/triton/models).
"""

import importlib.util
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


# moderation_ops.py, from this directory: the backend does not promise it on sys.path.
_SPEC = importlib.util.spec_from_file_location(
    "moderation_ops", os.path.join(os.path.dirname(os.path.abspath(__file__)), "moderation_ops.py"))
ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ops)


class TritonPythonModel:
    def initialize(self, args):
        import nudenet  # the wheel that carries the weights

        params = json.loads(args["model_config"]).get("parameters", {})
        version = str(args.get("model_version", ""))
        # "<name>@<version>" overrides "<name>" for one version (the same file serves each)
        params = {**params, **{k.split("@")[0]: v for k, v in params.items()
                               if k.endswith(f"@{version}")}}
        self.score_threshold = _param(params, "score_threshold", 0.25)
        self.iou_threshold = _param(params, "nms_iou_threshold", 0.45)
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(_param(params, "intra_op_threads", 2))
        weights = os.path.join(os.path.dirname(nudenet.__file__), "320n.onnx")
        self.session = ort.InferenceSession(weights, options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def execute(self, requests):
        responses = []
        for request in requests:
            items = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
            try:
                results = self.detect([bytes(item) for item in items])
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(str(exc))))
                continue
            out = np.array([[json.dumps(r).encode()] for r in results], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DETECTIONS", out)]))
        return responses

    def detect(self, images):
        blob, shapes = ops.prepare(images)
        raw = self.session.run(None, {self.input_name: blob})[0]  # [B, 4 + classes, anchors]
        return [ops.postprocess(raw[i], shapes[i], self.score_threshold, self.iou_threshold)
                for i in range(len(images))]


def _param(params, key, default):
    return float(params.get(key, {}).get("string_value", default))
