"""The language-model task: `LanguageModelTask` (task.py: the RL loop that runs an algorithm's
program each step) and held-out evaluation of the policy (evaluate.py).
"""
