"""The batcher worker: reads partitions, forms batches, calls Triton, writes results."""
