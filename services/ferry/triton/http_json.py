"""Triton's gRPC replies in the JSON shape its HTTP endpoint gives for the same question.

``MessageToDict`` differs from Triton's HTTP JSON in two ways: it writes 64-bit integers as
strings (proto3's JSON mapping), and it leaves out fields that hold their default. Triton's HTTP
server writes every field, and every integer as a number; so does this.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

_INT64 = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64,
                    FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_FIXED64,
                    FieldDescriptor.TYPE_SFIXED64})


def triton_json(message: Message) -> dict[str, Any]:
    """The reply as Triton's HTTP endpoint writes it (field names as in the .proto)."""
    data = MessageToDict(message, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)
    return _restore(message.DESCRIPTOR, data)


def _restore(descriptor: Any, data: dict[str, Any]) -> dict[str, Any]:
    for field in descriptor.fields:
        if field.name in data:
            data[field.name] = _field(field, data[field.name])
    return data


def _field(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entry = field.message_type.fields_by_name["value"]
        return {key: _single(entry, item) for key, item in value.items()}
    if field.is_repeated:
        return [_single(field, item) for item in value]
    return _single(field, value)


def _single(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(value, dict):
        return _restore(field.message_type, value)
    if field.type in _INT64 and isinstance(value, str):
        return int(value)
    return value
