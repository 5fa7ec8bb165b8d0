"""What each client costs: the usage ledger (counted exactly by the completion script), its
reader, the bound on the per-client metrics' labels, and ``ferry usage``."""
