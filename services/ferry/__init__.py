"""Ferry: batches inference requests that arrive one at a time and sends them to Triton together."""

__version__ = "0.1.0"
