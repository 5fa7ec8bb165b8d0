from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Task(_message.Message):
    __slots__ = ("task_id", "model", "model_version", "payload", "content_type", "enqueued_at_ms", "deadline_ms", "priority", "client_id", "trace_context", "input_digest", "digest_version", "callback_url", "inputs", "outputs", "request_id", "review_of", "shadow_of", "review_webhook")
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
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REVIEW_OF_FIELD_NUMBER: _ClassVar[int]
    SHADOW_OF_FIELD_NUMBER: _ClassVar[int]
    REVIEW_WEBHOOK_FIELD_NUMBER: _ClassVar[int]
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
    inputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    review_of: str
    shadow_of: str
    review_webhook: str
    def __init__(self, task_id: _Optional[str] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., enqueued_at_ms: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., priority: _Optional[int] = ..., client_id: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., input_digest: _Optional[str] = ..., digest_version: _Optional[str] = ..., callback_url: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., outputs: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., review_of: _Optional[str] = ..., shadow_of: _Optional[str] = ..., review_webhook: _Optional[str] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "datatype", "shape", "contents")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CONTENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    contents: bytes
    def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., contents: _Optional[bytes] = ...) -> None: ...
