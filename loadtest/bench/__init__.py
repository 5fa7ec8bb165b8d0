"""`make bench`: Ferry against Triton alone, same backend, same run."""
