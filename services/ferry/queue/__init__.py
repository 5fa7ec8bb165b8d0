"""The task queue: interface (base) beside its Redis Streams implementation."""
