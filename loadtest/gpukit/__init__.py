"""The GPU kit: Ferry and Triton alone side by side in front of a real vision model on a GPU
machine (docs/gpu-kit.md). ``scripts/gpu-kit.sh build`` packs it here; ``run`` runs there."""
