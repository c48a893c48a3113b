"""The language-model task: `LanguageModelTask` (the RL loop that runs an algorithm's program each step)
and held-out evaluation of the policy.

- evaluate.py: Held-out evaluation: responses of the current policy to a prompt batch, scored by the
  reward function, reported overall and per data source.
- task.py: `LanguageModelTask`: the RL loop on the controller for language-model post-training, what
  `RLTrainer` (entry.py) runs for a config of that task kind.
"""
