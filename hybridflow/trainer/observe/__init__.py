"""What a run reports: per-step metrics, steps without learning signal, the console, loggers,
plots, the live status file and `hybridflow monitor`.

- display.py: Console output of a run: a rich progress bar with the latest step's key numbers, or
  one plain line per step, or nothing (trainer.console = rich | plain | none).
- live_status.py: What a running job is doing now, for `hybridflow monitor` and for failure reports.
- loggers.py: Where a run's metrics go: one `RunLoggers` object fans each record out to the loggers
  named in `trainer.loggers`.
- metrics.py: Per-step metrics computed on the controller from the step's final batch.
- monitor.py: Watching a running job from outside: which worker is where, how busy, in which phase.
- plots.py: PNG plots of a run's metrics, read from <run>/metrics.jsonl: a language-model run's over
  RL steps (reward, KL, entropy, response length, held-out accuracy), an environment run's over
  environment steps (episode return and length, the algorithm's losses, throughput, policy lag).
- signal.py: Steps without learning signal: said on the console, counted, and (if asked) a stop.
"""
