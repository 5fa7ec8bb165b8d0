"""NudeNet 320n's pre- and post-processing: one source for the local moderation model (next to
this file) and the production ensemble's Python steps (deploy/triton/models: moderation_pre and
moderation_post get a copy of this file in their version directory). Plain functions of numpy
and OpenCV; no Triton import."""

import cv2
import numpy as np

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


def prepare(images):
    """The detector's input blob [B, 3, 320, 320] (letterboxed RGB in [0, 1]) and each image's
    [height, width]. An image that does not decode raises ValueError naming it."""
    decoded = [decode(data, index) for index, data in enumerate(images)]
    blob = np.stack([letterbox(image) for image in decoded])
    shapes = np.array([image.shape[:2] for image in decoded], dtype=np.int32)
    return blob, shapes


def decode(data, index):
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"moderation: item {index} of the batch is not a decodable image")
    return image


def letterbox(image):
    height, width = image.shape[:2]
    side = max(height, width)
    padded = cv2.copyMakeBorder(image, 0, side - height, 0, side - width, cv2.BORDER_CONSTANT)
    resized = cv2.resize(padded, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)
    rgb = cv2.cvtColor(resized, cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(rgb.transpose(2, 0, 1), dtype=np.float32) / 255.0


def postprocess(prediction, shape, score_threshold, iou_threshold):
    """One image's detections from the detector's [4 + classes, anchors] output: above the score
    threshold, after per-class non-maximum suppression, boxes as [x, y, width, height] in the
    original image's pixels (``shape`` is its [height, width])."""
    height, width = int(shape[0]), int(shape[1])
    rows = prediction.T  # [anchors, 4 + classes]
    scores = rows[:, 4:]
    class_ids = scores.argmax(axis=1)
    best = scores[np.arange(len(rows)), class_ids]
    keep = best >= score_threshold
    rows, class_ids, best = rows[keep], class_ids[keep], best[keep]
    scale = max(height, width) / SIZE  # letterbox pads right/bottom, so only a scale
    cx, cy, w, h = (rows[:, k] * scale for k in range(4))
    x0 = np.clip(cx - w / 2, 0, width)
    y0 = np.clip(cy - h / 2, 0, height)
    x1 = np.clip(cx + w / 2, 0, width)
    y1 = np.clip(cy + h / 2, 0, height)
    boxes = np.stack([x0, y0, x1 - x0, y1 - y0], axis=1)
    chosen = cv2.dnn.NMSBoxesBatched(
        boxes.tolist(), best.tolist(), class_ids.tolist(), score_threshold,
        iou_threshold) if len(boxes) else []
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

