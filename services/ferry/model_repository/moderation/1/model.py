"""NudeNet 320n content-moderation detector behind Triton's Python backend.

Per request: one encoded image. The batch is decoded, letterboxed to 320x320, run through the
detector in a single onnxruntime call, and each image gets back a JSON object with its detections
(label, score, box as [x, y, width, height] in the original image's pixels) after per-class
non-maximum suppression. An image that does not decode fails the whole batch with a message naming
it; Ferry isolates such a request and its batch-mates still succeed.
"""

import json
import os

import cv2
import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

SIZE = 320
# Class order of the 320n model, from nudenet 3.4.2's own source.
LABELS = (
    "FEMALE_GENITALIA_COVERED", "FACE_FEMALE", "BUTTOCKS_EXPOSED", "FEMALE_BREAST_EXPOSED",
    "FEMALE_GENITALIA_EXPOSED", "MALE_BREAST_EXPOSED", "ANUS_EXPOSED", "FEET_EXPOSED",
    "BELLY_COVERED", "FEET_COVERED", "ARMPITS_COVERED", "ARMPITS_EXPOSED", "FACE_MALE",
    "BELLY_EXPOSED", "MALE_GENITALIA_EXPOSED", "ANUS_COVERED", "FEMALE_BREAST_COVERED",
    "BUTTOCKS_COVERED",
)
# Labels that make an image "unsafe" in the summary flag.
EXPOSED = frozenset(label for label in LABELS if label.endswith("_EXPOSED") and "FEET" not in label
                    and "ARMPITS" not in label and "BELLY" not in label)


class TritonPythonModel:
    def initialize(self, args):
        import nudenet  # the wheel that carries the weights

        params = json.loads(args["model_config"]).get("parameters", {})
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
                results = self._detect([bytes(item) for item in items])
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(str(exc))))
                continue
            out = np.array([[json.dumps(r).encode()] for r in results], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DETECTIONS", out)]))
        return responses

    def _detect(self, images):
        decoded = [_decode(data, index) for index, data in enumerate(images)]
        blob = np.stack([_letterbox(image) for image in decoded])
        raw = self.session.run(None, {self.input_name: blob})[0]  # [B, 4 + classes, anchors]
        return [self._postprocess(raw[i], decoded[i].shape) for i in range(len(decoded))]

    def _postprocess(self, prediction, shape):
        height, width = shape[:2]
        rows = prediction.T  # [anchors, 4 + classes]
        scores = rows[:, 4:]
        class_ids = scores.argmax(axis=1)
        best = scores[np.arange(len(rows)), class_ids]
        keep = best >= self.score_threshold
        rows, class_ids, best = rows[keep], class_ids[keep], best[keep]
        scale = max(height, width) / SIZE  # letterbox pads right/bottom, so only a scale
        cx, cy, w, h = (rows[:, k] * scale for k in range(4))
        x0 = np.clip(cx - w / 2, 0, width)
        y0 = np.clip(cy - h / 2, 0, height)
        x1 = np.clip(cx + w / 2, 0, width)
        y1 = np.clip(cy + h / 2, 0, height)
        boxes = np.stack([x0, y0, x1 - x0, y1 - y0], axis=1)
        chosen = cv2.dnn.NMSBoxesBatched(
            boxes.tolist(), best.tolist(), class_ids.tolist(), self.score_threshold,
            self.iou_threshold) if len(boxes) else []
        detections = [
            {
                "label": LABELS[int(class_ids[i])],
                "score": round(float(best[i]), 4),
                "box": [round(float(v), 1) for v in boxes[i]],
            }
            for i in np.asarray(chosen, dtype=int).reshape(-1)
        ]
        detections.sort(key=lambda d: d["score"], reverse=True)
        unsafe = any(d["label"] in EXPOSED for d in detections)
        return {"detections": detections, "unsafe": unsafe, "width": width, "height": height}


def _param(params, key, default):
    return float(params.get(key, {}).get("string_value", default))


def _decode(data, index):
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"moderation: item {index} of the batch is not a decodable image")
    return image


def _letterbox(image):
    height, width = image.shape[:2]
    side = max(height, width)
    padded = cv2.copyMakeBorder(image, 0, side - height, 0, side - width, cv2.BORDER_CONSTANT)
    resized = cv2.resize(padded, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)
    rgb = cv2.cvtColor(resized, cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(rgb.transpose(2, 0, 1), dtype=np.float32) / 255.0
