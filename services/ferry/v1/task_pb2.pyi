from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Task(_message.Message):
    __slots__ = ("task_id", "model", "model_version", "payload", "content_type", "enqueued_at_ms", "deadline_ms", "priority", "client_id", "trace_context", "input_digest", "digest_version", "callback_url")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    INPUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DIGEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    model: str
    model_version: str
    payload: bytes
    content_type: str
    enqueued_at_ms: int
    deadline_ms: int
    priority: int
    client_id: str
    trace_context: _containers.ScalarMap[str, str]
    input_digest: str
    digest_version: str
    callback_url: str
    def __init__(self, task_id: _Optional[str] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., enqueued_at_ms: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., priority: _Optional[int] = ..., client_id: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., input_digest: _Optional[str] = ..., digest_version: _Optional[str] = ..., callback_url: _Optional[str] = ...) -> None: ...
