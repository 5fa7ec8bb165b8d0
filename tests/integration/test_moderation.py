"""The bundled moderation model through the whole stack, on a real photograph."""

from __future__ import annotations

import asyncio
import io

import pytest
from PIL import Image

from ferry.stack.up import sample_image
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, gateway_settings, running_stack

pytestmark = pytest.mark.integration


async def test_a_portrait_is_labelled_with_a_face_in_the_right_place(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    photo = sample_image().read_bytes()
    async with running_stack(gateway_settings(redis_url, url, default_model="moderation"),
                             batcher_settings(redis_url, url, max_wait_ms=20)) as stack:
        result = await stack.result(await stack.submit(photo, model="moderation",
                                                       content_type="image/jpeg"))
    assert result["status"] == "SUCCESS", result
    output = result["output"]["DETECTIONS"]
    assert (output["width"], output["height"]) == (512, 600)
    assert output["unsafe"] is False
    faces = [d for d in output["detections"] if d["label"] == "FACE_FEMALE"]
    assert len(faces) == 1 and faces[0]["score"] > 0.5
    x, y, w, h = faces[0]["box"]
    # The face is in the upper middle of the portrait.
    assert 100 < x < 250 and 80 < y < 250 and 120 < w < 260 and 120 < h < 280
    assert not any(d["label"].endswith("_EXPOSED") for d in output["detections"])


async def test_a_batch_of_mixed_images_gets_one_answer_each(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """Photos, blank images and a resized copy in one batch: each answer matches its own image."""
    url = triton_server.grpc_url
    photo = sample_image().read_bytes()
    small = _resized(photo, 0.5)
    blank = _blank_png()
    images = [photo, blank, small, blank, photo]
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=1000,
                                              adaptive_flush=False)) as stack:
        task_ids = await asyncio.gather(*(stack.submit(i, model="moderation",
                                                       content_type="image/jpeg")
                                          for i in images))
        results = await stack.results(task_ids)
        batches = stack.batchers[0].metrics.registry.get_sample_value(
            "ferry_batch_size_count", {"model": "moderation", "version": "1"})
    outputs = [r["output"]["DETECTIONS"] for r in results]
    assert batches == 1
    assert [o["detections"] == [] for o in outputs] == [False, True, False, True, False]
    assert (outputs[2]["width"], outputs[2]["height"]) == (256, 300)
    full_box, half_box = outputs[0]["detections"][0]["box"], outputs[2]["detections"][0]["box"]
    for full, half in zip(full_box, half_box, strict=True):
        assert abs(full / 2 - half) < 12  # boxes are in each image's own pixels


def _resized(data: bytes, factor: float) -> bytes:
    with Image.open(io.BytesIO(data)) as image:
        smaller = image.resize((int(image.width * factor), int(image.height * factor)))
    buffer = io.BytesIO()
    smaller.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _blank_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (320, 240), (255, 255, 255)).save(buffer, format="PNG")
    return buffer.getvalue()
