"""A lean pipelined Redis client for the hot path."""
