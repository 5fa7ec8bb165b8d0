"""What Ferry shows of itself: Prometheus metrics and logging set-up."""
