"""The language-model task kind: its part of the one lifecycle (part.py: prompts, reward and
the algorithm's roles; one RL step a step) and held-out evaluation of the policy (evaluate.py).
"""
