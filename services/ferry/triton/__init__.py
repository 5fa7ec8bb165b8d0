"""The inference backend: the interface (base) beside its Triton gRPC implementation."""
