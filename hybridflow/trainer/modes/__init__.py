"""The execution modes beside synchronous: one_step_off and async run the same program, its
generation served by a rollout pool's stream (docs/async.md).

- async_trainer.py: The asynchronous trainer modes: generation on its own pool, overlapped with
  training.
- stream_step.py: The asynchronous modes' step: the algorithm's own program, run next to the data.
"""
