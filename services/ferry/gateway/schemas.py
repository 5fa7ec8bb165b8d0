"""Request and response shapes, for validation of output and for the OpenAPI docs at /docs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class InferenceRequest(BaseModel):
    """JSON form of ``POST /v1/inference`` (raw bodies are accepted too, by Content-Type)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="Triton model; default: the gateway's default")
    input: str | None = Field(None, description="text payload, sent to the model as UTF-8 bytes")
    input_base64: str | None = Field(None, description="binary payload (an image, say), base64")
    client_id: str | None = Field(None, description="who is asking, for accounting")


class Accepted(BaseModel):
    task_id: str = Field(description="128 random bits, hex")
    status_url: str


class TaskResult(BaseModel):
    task_id: str
    status: Literal["PENDING", "SUCCESS", "FAILED", "EXPIRED"]
    model: str
    model_version: str | None = None
    created_at: float = Field(description="Unix seconds when the gateway accepted the task")
    finished_at: float | None = None
    output: Any = Field(None, description="the model's outputs by name, as JSON")
    error: str | None = None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


RAW_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": InferenceRequest.model_json_schema()},
            "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "text/plain": {"schema": {"type": "string"}},
        },
    }
}

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {400: "bad input", 404: "unknown model or task", 413: "body too large",
                       415: "unsupported Content-Type", 422: "model unusable",
                       503: "Redis or Triton unavailable"}.items()
}
