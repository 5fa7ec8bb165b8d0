"""The production moderation repository (deploy/triton/models) on a real tritonserver: its
ensemble (pre-processing, the detector, post-processing) answers exactly as the local moderation
model does, directly and through Ferry. The TensorRT step is a stand-in running the same ONNX
file (no GPU here); the engine itself can only be built and timed on a GPU."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from PIL import Image

from ferry.stack.up import sample_image
from ferry.triton.grpc_backend import TritonGrpcBackend
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, gateway_settings, running_stack

pytestmark = pytest.mark.integration


def images() -> list[bytes]:
    photo = sample_image().read_bytes()
    with Image.open(io.BytesIO(photo)) as image:
        wide = image.resize((900, 300))  # a different aspect: letterbox and scale back
        buffer = io.BytesIO()
        wide.save(buffer, format="PNG")
    blank = io.BytesIO()
    Image.new("RGB", (320, 240), (255, 255, 255)).save(blank, format="PNG")
    return [photo, buffer.getvalue(), blank.getvalue(), photo]


def infer(client: triton_grpc.InferenceServerClient, model: str,
          batch: list[bytes]) -> list[dict[str, Any]]:
    tensor = triton_grpc.InferInput("IMAGE", [len(batch), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b] for b in batch], dtype=np.object_))
    answer = client.infer(model, [tensor])
    return [json.loads(row[0]) for row in answer.as_numpy("DETECTIONS")]


def test_the_ensemble_answers_as_the_local_model_does(triton_server: TritonServer) -> None:
    client = triton_grpc.InferenceServerClient(triton_server.grpc_url)
    try:
        batch = images()
        local = infer(client, "moderation", batch)
        production = infer(client, "moderation_ensemble", batch)
        assert production == local
        assert production[0]["detections"] and production[3] == production[0]
        assert production[2]["detections"] == []  # the blank image
        assert (production[1]["width"], production[1]["height"]) == (900, 300)
        metadata = client.get_model_config("moderation_ensemble", as_json=True)["config"]
        assert metadata["parameters"]["ferry_input_kind"]["string_value"] == "image"
        with pytest.raises(Exception, match="item 1 of the batch is not a decodable image"):
            infer(client, "moderation_ensemble", [batch[0], b"not an image"])
    finally:
        client.close()


async def test_an_ensemble_gets_as_many_batches_in_flight_as_its_narrowest_step(
    triton_server: TritonServer,
) -> None:
    backend = TritonGrpcBackend(triton_server.grpc_url)
    await backend.start()
    try:
        spec = await backend.model_spec("moderation_ensemble")
        # steps: pre 4 CPU instances, the engine's stand-in 2, post 2
        assert spec.instances == 2 and spec.max_batch_size == 64
        assert (await backend.model_spec("moderation")).instances == 1
    finally:
        await backend.close()


async def test_ferry_serves_the_ensemble_and_refuses_what_it_cannot_read(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    batch = images()
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=200)) as stack:
        task_ids = await asyncio.gather(*(stack.submit(i, model="moderation_ensemble",
                                                       content_type="image/jpeg")
                                          for i in batch))
        results = await stack.results(task_ids)
        refused = await stack.client.post("/v1/inference?model=moderation_ensemble",
                                          content=b"plain text", headers={
                                              "Content-Type": "application/octet-stream"})
    assert [r["status"] for r in results] == ["SUCCESS"] * 4
    faces = [d for d in results[0]["output"]["DETECTIONS"]["detections"]
             if d["label"] == "FACE_FEMALE"]
    assert len(faces) == 1 and faces[0]["score"] > 0.5
    assert refused.status_code in (400, 415, 422), refused.text
    assert "image" in refused.text
