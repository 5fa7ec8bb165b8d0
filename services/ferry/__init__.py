"""Ferry: batches inference requests that arrive one at a time and sends them to Triton together."""

__version__ = "0.1.0"
SERVER_NAME = "ferry"  # what Ferry answers as the protocol's server metadata 'name'
