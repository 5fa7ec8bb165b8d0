"""The Open Inference Protocol (KServe v2) as Triton speaks it."""
