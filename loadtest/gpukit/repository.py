"""The kit's model repository: one classifier, served four ways.

``<arch>`` has no dynamic batching (Ferry batches for it), ``<arch>_triton`` has Triton's dynamic
batcher with its default queue delay of 0 (Triton alone); each with 1 instance and again with 2
(``_x2``). Every copy runs the same ``model.py`` (loadtest/gpukit/model). Instances are
``KIND_CPU`` to Triton: the model puts itself on the GPU, so Triton needs no CUDA of its own.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

MODEL_SOURCE = Path(__file__).with_name("model") / "model.py"
INPUT, OUTPUT = "IMAGE", "CLASSES"
MAX_BATCH = 64


@dataclass(frozen=True)
class Engine:
    """What runs the model: ``torch`` on ``device``, or ``tiny`` (numpy, the dry run)."""

    engine: str = "torch"
    device: str = "cuda"
    arch: str = "resnet50"
    image_size: int = 224
    cuda_graphs: bool = True
    input_kind: str = "image"  # what Ferry's gateway checks: "image" decodes each, "bytes" none

    @property
    def label(self) -> str:
        if self.engine == "tiny":
            return "tiny numpy classifier (CPU)"
        return f"torchvision {self.arch} ({self.device})"


@dataclass(frozen=True)
class Variant:
    """One of the served copies."""

    name: str
    instances: int
    triton_batching: bool


def model_name(arch: str, instances: int, *, triton_batching: bool) -> str:
    """``resnet50``, ``resnet50_triton``, ``resnet50_x2``, ``resnet50_triton_x2``..."""
    return (f"{arch}{'_triton' if triton_batching else ''}"
            f"{'' if instances == 1 else f'_x{instances}'}")


def variants(arch: str, instance_counts: tuple[int, ...] = (1, 2)) -> list[Variant]:
    return [Variant(model_name(arch, count, triton_batching=batching), count, batching)
            for count in instance_counts for batching in (False, True)]


def config(variant: Variant, engine: Engine, report_dir: Path | None) -> str:
    """The config.pbtxt of one copy."""
    params = {"engine": engine.engine, "device": engine.device, "arch": engine.arch,
              "image_size": str(engine.image_size),
              "cuda_graphs": "true" if engine.cuda_graphs else "false",
              "ferry_input_kind": engine.input_kind}
    if report_dir is not None:
        params["report_dir"] = str(report_dir)
    lines = [
        f'name: "{variant.name}"', 'backend: "python"', f"max_batch_size: {MAX_BATCH}",
        f'input [ {{ name: "{INPUT}" data_type: TYPE_STRING dims: [ 1 ] }} ]',
        f'output [ {{ name: "{OUTPUT}" data_type: TYPE_STRING dims: [ 1 ] }} ]',
        f"instance_group [ {{ count: {variant.instances} kind: KIND_CPU }} ]",
    ]
    if variant.triton_batching:
        lines.append("dynamic_batching { max_queue_delay_microseconds: 0 }")
    lines += [f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
              for k, v in params.items()]
    return "\n".join(lines) + "\n"


def write(root: Path, engine: Engine, served: list[Variant],
          report_dir: Path | None = None) -> Path:
    """A fresh model repository at ``root`` holding ``served``."""
    shutil.rmtree(root, ignore_errors=True)
    for variant in served:
        folder = root / variant.name
        (folder / "1").mkdir(parents=True)
        shutil.copy2(MODEL_SOURCE, folder / "1" / "model.py")
        (folder / "config.pbtxt").write_text(config(variant, engine, report_dir))
    return root
