"""The generated envelope code is exactly what `make proto` produces from proto/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ("ferry/v1/task_pb2.py", "ferry/v1/task_pb2.pyi")


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}",
         f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", "ferry/v1/task.proto"],
        check=True, cwd=ROOT)
    for name in GENERATED:
        fresh = (tmp_path / name).read_text()
        committed = (ROOT / "services" / name).read_text()
        assert fresh == committed, f"services/{name} is stale: run `make proto`"
