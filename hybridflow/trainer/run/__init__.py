"""A run's life, a module each: its directory (run_dir.py), setup (setup.py) and pre-flight checks
(preflight.py), where it starts, fresh or resumed (lifecycle.py), checkpoints (checkpointing.py),
recovery after a worker failure (recovery.py), elastic restarts (elastic.py), SIGTERM (stop_signal.py).
"""
