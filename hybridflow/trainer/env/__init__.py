"""Environment tasks (PPO, SAC and your registered environment algorithms on Gymnasium-style
environments), what `RLTrainer` runs for a config that names an `env`:

- task.py: `EnvironmentTask` (the loop over iterations, records, checkpoints, release);
- programs.py: the `EnvProgram`s named by the environment-algorithm rows
  (config/env_algorithms.py): PPO and SAC, each a short sequence of named phases;
- specs.py: from the config to what the workers are built with;
- groups.py: env runners and learners as `WorkerGroup`s (or in-process ones);
- records.py: metrics records and the console line (their PNG plots: trainer/observe/plots.py).
"""
