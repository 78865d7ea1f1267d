"""The opaque types of Kubernetes' CEL libraries, as protobuf messages of a private pool.

cel-expr-python (Google's C++ CEL) passes only CEL's own values and protobuf messages between CEL
and Python functions, so each Kubernetes opaque type (``kubernetes.Quantity``, ``kubernetes.URL``,
``kubernetes.Semver``, ``net.IP``, ``net.CIDR``; k8s.io/apiserver pkg/cel/types.go and
pkg/cel/library) is a message with one string field holding its canonical form: ``type(x)`` names
the Kubernetes type, and ``==`` compares the canonical forms, which is what the Kubernetes types'
``Equal`` does (a Quantity's exact value, an IP's address, a CIDR's prefix, a version's text).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)

__all__ = ["OPAQUE", "message_class", "pool"]

# CEL type name -> (proto package, message name)
OPAQUE: dict[str, tuple[str, str]] = {
    "kubernetes.Quantity": ("kubernetes", "Quantity"),
    "kubernetes.URL": ("kubernetes", "URL"),
    "kubernetes.Semver": ("kubernetes", "Semver"),
    "net.IP": ("net", "IP"),
    "net.CIDR": ("net", "CIDR"),
}


@cache
def pool() -> descriptor_pool.DescriptorPool:
    """A descriptor pool with the well-known types CEL needs and the opaque Kubernetes types."""
    built = descriptor_pool.DescriptorPool()
    for module in (duration_pb2, timestamp_pb2, struct_pb2, wrappers_pb2):
        built.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    for package in sorted({p for p, _ in OPAQUE.values()}):
        proto = descriptor_pb2.FileDescriptorProto(
            name=f"mpigate/cel/{package}.proto", package=package, syntax="proto3"
        )
        for pkg, name in OPAQUE.values():
            if pkg == package:
                message = proto.message_type.add(name=name)
                message.field.add(
                    name="value",
                    number=1,
                    type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                )
        built.Add(proto)
    return built


@cache
def message_class(type_name: str) -> Any:
    """The Python class of the opaque type ``type_name`` (``kubernetes.Quantity``)."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(type_name))
