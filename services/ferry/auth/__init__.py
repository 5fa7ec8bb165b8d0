"""Who is asking: API keys and JWTs (``FERRY_AUTH``), and the per-client request rate limit."""
