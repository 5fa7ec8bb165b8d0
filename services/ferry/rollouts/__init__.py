"""Model versions in production: rollouts (a candidate version beside the stable one, its share
stepped up or rolled back by a guard), shadow traffic compared with the primary's answers, and
the two-tier cascade. The pure rules (``rollout``, ``guard``, ``window``, ``compare``,
``cascade``) stand apart from their Redis I/O (``store``)."""
