"""Environment tasks (PPO, SAC and your registered environment algorithms on Gymnasium-style
environments), what `RLTrainer` runs for a config that names an `env`: `EnvironmentTask` (task.py),
the programs of the environment-algorithm rows (programs.py), what the workers are built with
(specs.py), the worker groups (groups.py), records and console (records.py), checkpoint state
(state.py).
"""
