"""Version 2 of the content-moderation detector: version 1's code (``../1/model.py``) run with
this version's parameters (``score_threshold@2`` in config.pbtxt: fewer, surer detections).
Triton's Python backend wants a model.py in each version's directory; this one loads version 1's
rather than copying it."""

import importlib.util
import os

_SPEC = importlib.util.spec_from_file_location(
    "moderation_version_1",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "1", "model.py"))
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)

TritonPythonModel = _MODULE.TritonPythonModel
