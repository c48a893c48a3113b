"""What a run reports: per-step metrics, steps without learning signal, the console, loggers,
plots, the live status file and `hybridflow monitor`.
"""
