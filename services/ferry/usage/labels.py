"""The per-client metrics' bounded label set: at most ``limit`` clients are named, the rest are
``other``. Pure code over a clock passed in.

Until the set is full, a client is named when first seen. Every ``RERANK_S`` the set becomes
the ``limit`` clients that cost the most GPU time in this process so far (ties: the one named
already, then by name), so a heavy client that came late is named within a minute. A client
dropped from the set keeps its series (a counter never goes back), which only stop growing;
what it costs from then on counts under ``other``. Costs are kept for at most ``KEPT`` times
``limit`` clients: the cheapest are forgotten at each rerank.
"""

from __future__ import annotations

OTHER = "other"
RERANK_S = 60.0
KEPT = 10


class ClientLabels:
    """Which client a per-client series names."""

    def __init__(self, limit: int, now: float = 0.0) -> None:
        self.limit = max(0, limit)
        self.named: set[str] = set()
        self.costs: dict[str, float] = {}
        self.ranked_at = now

    def label(self, client: str) -> str:
        """The client's label value: itself if named (or if there is room), else ``other``."""
        if client in self.named:
            return client
        if len(self.named) < self.limit and client != OTHER:
            self.named.add(client)
            return client
        return OTHER

    def charge(self, client: str, gpu_s: float) -> None:
        """Add what a task of the client cost."""
        self.costs[client] = self.costs.get(client, 0.0) + gpu_s

    def refresh(self, now: float) -> bool:
        """Rerank if ``RERANK_S`` has passed since the last time; whether it did."""
        if now - self.ranked_at < RERANK_S:
            return False
        self.ranked_at = now
        self.rerank()
        return True

    def rerank(self) -> None:
        """Name the clients that cost the most; forget the cheapest costs."""
        ranked = sorted(self.costs, key=lambda c: (-self.costs[c], c not in self.named, c))
        top = [client for client in ranked if client != OTHER][:self.limit]
        rest = sorted(client for client in self.named if client not in top)
        self.named = set(top) | set(rest[:self.limit - len(top)])
        self.costs = {client: self.costs[client] for client in ranked[:KEPT * self.limit]}
