"""The algorithms as programs: one short function per algorithm over worker groups (what every
mode runs), built from named phases.

- algorithms.py: RL algorithms as short programs over worker groups (HybridFlow paper, Figure 4).
- phases.py: The phases of an RL step, each one named function on worker-group calls.
"""
