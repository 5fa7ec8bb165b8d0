"""Models with several versions, added to the test repository for rollouts (issue 19).

- ``sim_versions``: the simulator with versions 1 to 5 (``version_policy: all``): 1 as ``sim``;
  2 marks about one input in four ``"variant": true`` (its answers differ from 1's on those);
  3 fails every request; 4 takes 80 ms more per batch; 5 is 1 again (an identical candidate).

The bundled ``moderation`` has two versions of its own (2 keeps detections scoring at least 0.7,
1 at 0.25, so their labels and ``unsafe`` differ on some images; 1 is its default version).
"""

from __future__ import annotations

import shutil
from pathlib import Path

ALL_VERSIONS = "version_policy: { all { } }\n"


def add_version_models(target: Path) -> None:
    _versioned(target, "sim", "sim_versions", 5, {
        "differ_every@2": "4", "fail@3": "1", "fixed_ms@4": "85"})


def _versioned(target: Path, source: str, name: str, versions: int,
               parameters: dict[str, str]) -> None:
    model = target / name
    shutil.copytree(target / source, model, ignore=shutil.ignore_patterns("__pycache__"))
    for version in range(2, versions + 1):
        shutil.copytree(model / "1", model / str(version),
                        ignore=shutil.ignore_patterns("__pycache__"))
    config = (model / "config.pbtxt").read_text().replace(f'name: "{source}"', f'name: "{name}"')
    extra = "".join(f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
                    for key, value in parameters.items())
    (model / "config.pbtxt").write_text(config + ALL_VERSIONS + extra)
