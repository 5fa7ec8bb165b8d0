"""Local process management: the pieces that `ferry up` and the test fixtures start on loopback."""
