"""``ferry up``'s banner: its first request names a model the repository has, with an input that
model takes (an image, a text, or its tensors), and says which job sources it allows."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import orjson
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ferry.gateway.intake import parse_submission
from ferry.jobs.manifest import Sources
from ferry.settings import UpSettings
from ferry.stack.banner import banner, first_request, model_config_text
from ferry.stack.up import bundled_repository, sample_image, samples_source
from ferry.submission import TensorSubmission
from tests.tensor_models import TENSOR_MODELS

BASE = "http://127.0.0.1:8000"
BIG = """max_batch_size: 4
input [ { name: "PIXELS" data_type: TYPE_FP32 dims: [ 3, 320, 320 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""


def request_for(model: str, config: str | None, tmp_path: Path) -> list[str]:
    """The banner's first request for ``model`` with ``config``, as the words a shell sees."""
    return shlex.split(first_request(BASE, model, config, sample_image(),
                                     tmp_path / "first-request.json").curl)


def test_the_bundled_models_get_an_image_and_a_text(tmp_path: Path) -> None:
    repository = bundled_repository()
    moderation = request_for("moderation", model_config_text(repository, "moderation"),
                             tmp_path)
    assert moderation[-1] == f"{BASE}/v1/inference?model=moderation"
    assert "Content-Type: image/jpeg" in moderation
    assert f"@{sample_image()}" in moderation
    sim = request_for("sim", model_config_text(repository, "sim"), tmp_path)
    assert sim[-1] == f"{BASE}/v1/inference?model=sim"
    assert sim[sim.index("-H") + 1] == "Content-Type: text/plain"


def test_a_model_without_a_config_at_hand_gets_a_text(tmp_path: Path) -> None:
    assert model_config_text(tmp_path, "elsewhere") is None
    words = request_for("elsewhere", None, tmp_path)
    assert "Content-Type: text/plain" in words and words[-1].endswith("?model=elsewhere")
    assert request_for("odd", "this is not a model config {", tmp_path) == \
        request_for("odd", None, tmp_path)


@pytest.mark.parametrize("model", sorted(TENSOR_MODELS))
def test_a_tensor_model_gets_every_input_in_the_tensor_form(model: str, tmp_path: Path) -> None:
    config = f'name: "{model}"\nbackend: "python"\n{TENSOR_MODELS[model]}'
    request = first_request(BASE, model, config, sample_image(), tmp_path / "f")
    words = shlex.split(request.curl)
    assert words[-1] == f"{BASE}/v1/inference?model={model}"
    assert "Content-Type: application/json" in words
    body = request.body or words[words.index("-d") + 1].encode()
    submission = parse_submission(body, "application/json", model)  # the gateway's own reading
    assert isinstance(submission, TensorSubmission)
    declared = text_format.Parse(config, model_config_pb2.ModelConfig()).input
    assert [t.name for t in submission.tensors.request.inputs] == [t.name for t in declared]


def test_a_long_tensor_body_goes_to_a_file_the_curl_reads(tmp_path: Path) -> None:
    path = tmp_path / "first-request.json"
    request = first_request(BASE, "big", BIG, sample_image(), path)
    assert f"@{path}" in shlex.split(request.curl)
    doc = orjson.loads(request.body)
    assert doc["inputs"][0]["shape"] == [1, 3, 320, 320]
    assert len(doc["inputs"][0]["data"]) == 3 * 320 * 320
    assert isinstance(parse_submission(request.body, "application/json", "big"),
                      TensorSubmission)


def test_the_banner_names_the_default_model_and_its_request(tmp_path: Path) -> None:
    settings = UpSettings(default_model="sim", redis_url="redis://127.0.0.1:6379/0",
                          triton_url="127.0.0.1:8001", job_sources=samples_source())
    request = first_request(f"http://{settings.host}:{settings.port}", "sim", None,
                            sample_image(), tmp_path / "f")
    text = banner(settings, tmp_path / "logs", tmp_path / "admin-token", request)
    assert "Try it (a text to the sim model, then its result):" in text
    assert f"  {request.curl}\n" in text and "moderation" not in text
    assert f"job sources    {samples_source()}" in text
    assert "logger" not in text  # no log_models: no logger
    logging = dataclasses.replace(settings, log_models="sim=1", log_metrics_port=9411,
                                  log_sink="/tmp/state/inference-log")
    text = banner(logging, tmp_path / "logs", tmp_path / "admin-token", request)
    assert ("  logger         metrics http://127.0.0.1:9411/metrics, records in "
            "/tmp/state/inference-log\n") in text


def test_ferry_up_allows_its_samples_and_nothing_else() -> None:
    """The source ``ferry up`` allows by default: the photo docs/jobs.md names, not its
    neighbours outside the samples directory."""
    sources = Sources.parse(samples_source())
    assert sources.refusal(sample_image().as_uri()) == ""
    assert sources.refusal(sample_image().parent.parent.joinpath("cli.py").as_uri()) != ""
    assert sources.refusal(Path("/etc/passwd").as_uri()) != ""
