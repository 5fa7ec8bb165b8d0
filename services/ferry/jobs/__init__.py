"""Bulk jobs: thousands of inputs under one id, fed at batch priority, resumable."""
