"""The production moderation repository (deploy/triton/models), read without a server: its steps,
chained, answer as the local model does (they run its code), its configs agree with each other
and with the ONNX file the engine is built from, and its image's versions are the lock's. (The
ensemble runs on a real tritonserver in tests/integration/test_tensorrt_ensemble.py.)"""

from __future__ import annotations

import importlib.util
import io
import re
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from ferry.stack.up import bundled_repository, sample_image

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "deploy" / "triton" / "models"
ONNX = Path(importlib.util.find_spec("nudenet").origin).parent / "320n.onnx"  # type: ignore[arg-type, union-attr]


def load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The local model and the two production steps laid out as the Triton image has them (the
    local model's moderation_ops.py next to each), with a stand-in for Triton's utilities module
    (only its names are needed to import them)."""
    layout = tmp_path_factory.mktemp("image-models")
    ops = bundled_repository() / "moderation" / "1" / "moderation_ops.py"
    for step in ("moderation_pre", "moderation_post"):
        shutil.copytree(MODELS / step, layout / step)
        shutil.copy(ops, layout / step / "1")
    stub = types.ModuleType("triton_python_backend_utils")
    saved = sys.modules.get(stub.__name__)
    sys.modules[stub.__name__] = stub
    try:
        yield {"local": load(bundled_repository() / "moderation" / "1" / "model.py", "local_m"),
               "pre": load(layout / "moderation_pre" / "1" / "model.py", "pre_m"),
               "post": load(layout / "moderation_post" / "1" / "model.py", "post_m")}
    finally:
        if saved is None:
            del sys.modules[stub.__name__]
        else:
            sys.modules[stub.__name__] = saved


def images() -> list[bytes]:
    photo = sample_image().read_bytes()
    out = [photo]
    with Image.open(io.BytesIO(photo)) as image:
        for size in ((900, 300), (100, 700)):
            buffer = io.BytesIO()
            image.resize(size).save(buffer, format="PNG")
            out.append(buffer.getvalue())
    return out


def detector() -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(ONNX), providers=["CPUExecutionProvider"])


def test_the_steps_chained_answer_as_the_local_model(modules: dict[str, Any]) -> None:
    """pre -> the detector -> post, in process, gives the local model's detections."""
    local, pre, post = modules["local"], modules["pre"], modules["post"]
    batch = images()
    pixels, shapes = pre.ops.prepare(batch)
    assert pixels.shape == (3, 3, 320, 320) and pixels.dtype == np.float32
    assert shapes.tolist() == [[600, 512], [300, 900], [700, 100]]
    session = detector()
    raw = session.run(["output0"], {"images": pixels})[0]
    chained = [post.ops.postprocess(raw[i], shapes[i], 0.25, 0.45) for i in range(len(batch))]
    model = local.TritonPythonModel()
    model.score_threshold, model.iou_threshold = 0.25, 0.45
    model.session, model.input_name = session, "images"
    assert chained == model.detect(batch)
    assert any(d["label"] == "FACE_FEMALE" for d in chained[0]["detections"])
    with pytest.raises(ValueError, match="item 1 of the batch is not a decodable image"):
        pre.ops.prepare([batch[0], b"not an image"])


def config(name: str) -> str:
    return (MODELS / name / "config.pbtxt").read_text()


def tensors(text: str, kind: str) -> dict[str, tuple[str, list[int]]]:
    """name -> (data type, dims) of a config's inputs or outputs."""
    block = re.search(kind + r" \[(.*?)\n\]", text, re.DOTALL)
    assert block is not None
    found = re.findall(r'name: "(\w+)"\s+data_type: (\w+)\s+dims: \[ ([0-9, ]+) \]', block[1])
    return {n: (t, [int(d) for d in dims.split(",")]) for n, t, dims in found}


def test_the_engine_config_fits_the_onnx_file_and_the_ensemble() -> None:
    engine = config("moderation_trt")
    assert 'platform: "tensorrt_plan"' in engine and "max_batch_size: 64" in engine
    assert "kind: KIND_GPU" in engine and 'profile: [ "0" ]' in engine
    assert "--fp16" in engine and "--maxShapes=images:64x3x320x320" in engine
    session = detector()
    (given,), (made,) = session.get_inputs(), session.get_outputs()
    out = session.run(None, {given.name: np.zeros((2, 3, 320, 320), np.float32)})[0]
    assert tensors(engine, "input") == {given.name: ("TYPE_FP32", [3, 320, 320])}
    assert tensors(engine, "output") == {made.name: ("TYPE_FP32", list(out.shape[1:]))}
    ensemble = config("moderation")
    assert 'platform: "ensemble"' in ensemble and "max_batch_size: 64" in ensemble
    steps = re.findall(r'model_name: "(\w+)"', ensemble)
    assert steps == ["moderation_pre", "moderation_trt", "moderation_post"]
    for step in steps:  # every mapped name exists on its step's side
        text = config(step)
        ins, outs = tensors(text, "input"), tensors(text, "output")
        block = ensemble[ensemble.index(f'model_name: "{step}"') + 1:]
        block = block[:block.index("model_name") if "model_name" in block else None]
        assert set(re.findall(r'input_map \{ key: "(\w+)"', block)) == set(ins)
        assert set(re.findall(r'output_map \{ key: "(\w+)"', block)) <= set(outs)
        assert "max_batch_size: 64" in text
    local = (bundled_repository() / "moderation" / "config.pbtxt").read_text()
    assert tensors(ensemble, "input") == tensors(local, "input")  # Ferry's contract, unchanged
    assert tensors(ensemble, "output") == tensors(local, "output")
    assert 'key: "ferry_input_kind" value: { string_value: "image" }' in ensemble
    assert tensors(config("moderation_pre"), "output")["PIXELS"] == ("TYPE_FP32", [3, 320, 320])


def test_the_triton_image_uses_the_locks_versions() -> None:
    dockerfile = (ROOT / "deploy" / "triton" / "Dockerfile").read_text()
    lock = dict(line.split("==", 1) for line in (ROOT / "requirements.lock").read_text().split()
                if "==" in line)
    pins = re.findall(r"([a-z0-9-]+)==([0-9.]+)", dockerfile)
    assert {name for name, _ in pins} == {"opencv-python-headless", "numpy", "nudenet"}
    for name, version in pins:
        assert lock[name] == version, name
    assert "COPY deploy/triton/models /opt/ferry/models" in dockerfile
    for step in ("moderation_pre", "moderation_post"):  # the local model's code, in each step
        assert (f"COPY services/ferry/model_repository/moderation/1/moderation_ops.py "
                f"/opt/ferry/models/{step}/1/") in dockerfile
    assert "moderation_trt/model.onnx" in dockerfile and "USER 10001" in dockerfile
