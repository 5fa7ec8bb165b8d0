"""When a batch leaves and what goes in it: pure code over a clock the caller passes in."""
