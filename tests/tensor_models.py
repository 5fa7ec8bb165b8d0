"""Tensor models of every kind for the client matrix (issue 16), added to the test repository.

Each is a Python-backend model whose code is in ``tests/integration/standin/<name>.py`` and whose
answers are exact functions of its inputs, so the same request gets the same bytes from Ferry
and from Triton:

- ``int8_bytes``: INT8 [4] and BYTES [1] in; the INT8 doubled (wrapping), the bytes reversed;
- ``half``: FP16 [8] and BF16 [8] in, each times 3 in its own datatype (BF16 through DLPack:
  the Python backend has no numpy form for it);
- ``mixed``: INT32 [2], FP64 [3] and UINT16 [-1] in; their sum per row (FP64), the INT32
  negated and which UINT16 are odd (BOOL [-1]) out;
- ``nobatch``: ``max_batch_size: 0``, INT64 [-1, 3] in (no batch dimension), its transpose and
  column sums out;
- ``mix``: FP32 [4] and INT32 [2] in; the FP32 doubled and each row's total out. No test but the
  statistics' and perf_analyzer's asks for it, as a model Ferry's code was not written around.

The batched ones have dynamic batching, so Triton's statistics count the rows of each call.
The moderation ensemble's engine step (``moderation_trt``, FP32 [3, 320, 320] under
onnxruntime) is added by ``add_tensorrt_ensemble`` and needs nothing here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

STANDIN = Path(__file__).parent / "integration" / "standin"
BATCHED = """max_batch_size: 8
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

TENSOR_MODELS: dict[str, str] = {
    "int8_bytes": BATCHED + """input [
  { name: "NUMBERS" data_type: TYPE_INT8 dims: [ 4 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "DOUBLED" data_type: TYPE_INT8 dims: [ 4 ] },
  { name: "REVERSED" data_type: TYPE_STRING dims: [ 1 ] }
]
""",
    "half": BATCHED + """input [
  { name: "HALF" data_type: TYPE_FP16 dims: [ 8 ] },
  { name: "BRAIN" data_type: TYPE_BF16 dims: [ 8 ] }
]
output [
  { name: "HALF_SCALED" data_type: TYPE_FP16 dims: [ 8 ] },
  { name: "BRAIN_SCALED" data_type: TYPE_BF16 dims: [ 8 ] }
]
""",
    "mixed": BATCHED + """input [
  { name: "COUNTS" data_type: TYPE_INT32 dims: [ 2 ] },
  { name: "WEIGHTS" data_type: TYPE_FP64 dims: [ 3 ] },
  { name: "CODES" data_type: TYPE_UINT16 dims: [ -1 ] }
]
output [
  { name: "TOTAL" data_type: TYPE_FP64 dims: [ 1 ] },
  { name: "NEGATED" data_type: TYPE_INT32 dims: [ 2 ] },
  { name: "ODD" data_type: TYPE_BOOL dims: [ -1 ] }
]
""",
    "mix": BATCHED + """input [
  { name: "VALUES" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "STEPS" data_type: TYPE_INT32 dims: [ 2 ] }
]
output [
  { name: "SCALED" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] }
]
""",
    "nobatch": """max_batch_size: 0
instance_group [ { count: 1, kind: KIND_CPU } ]
input [ { name: "MATRIX" data_type: TYPE_INT64 dims: [ -1, 3 ] } ]
output [
  { name: "TRANSPOSED" data_type: TYPE_INT64 dims: [ 3, -1 ] },
  { name: "SUMS" data_type: TYPE_INT64 dims: [ 3 ] }
]
""",
}


def add_tensor_models(target: Path) -> None:
    """Each of ``TENSOR_MODELS`` as ``target/<name>``: its config and its version 1."""
    for name, config in TENSOR_MODELS.items():
        model = target / name
        (model / "1").mkdir(parents=True)
        shutil.copy(STANDIN / f"{name}.py", model / "1" / "model.py")
        (model / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
