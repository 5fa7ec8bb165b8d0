"""``ferry plan``: fit a model's batch cost, simulate Ferry's own batching policy on a simulated
clock, and size a deployment for a target load and p99."""
