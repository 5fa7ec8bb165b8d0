"""Where results live until the client reads them: interface (base) and Redis implementation."""
