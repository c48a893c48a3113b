"""A run's life: its directory, setup and pre-flight checks, where it starts (fresh or resumed),
checkpoints, recovery after a worker failure, elastic restarts, SIGTERM.

- checkpointing.py: Run-level checkpoints of the RL loop: where they live, how to find, write and
  read them, and how a run directory is reopened to continue after one (which checkpoint a run
  resumes, with which config, is decided in run/lifecycle.py).
- elastic.py: Elastic restarts: the world size a run continues with after it lost (or gained) nodes.
- lifecycle.py: Where a run starts from, decided in one place for every entry point.
- preflight.py: Checks of what a run reads, made on the controller before its run directory exists
  and before Ray starts: the model directories, the data files and the reward file.
- recovery.py: Automatic recovery: restart the workers from the newest checkpoint when one fails.
- run_dir.py: The run directory: where a run's config, metrics, checkpoints and models go.
- setup.py: Everything a run needs before its first step, built from the validated config.
- stop_signal.py: Stopping a run cleanly on SIGTERM (what `timeout`, a scheduler or a job runner
  sends) or SIGINT (Ctrl-C), for every task kind (language-model runs, environment tasks).
"""
