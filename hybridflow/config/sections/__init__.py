"""The sections of the run config tree (`RunConfig`, hybridflow/config/schema.py), one module per
section, each setting defined once, in its section's class: async_rl.py (`async_rl`), data.py,
model.py, resources.py, rewards.py (`reward`, `reward_model`, `cost_model`), roles.py (`actor`,
`critic`), sft.py, trainer.py. Other trees reuse some: reward-model runs resources.py's
`ComputeSection` and trainer.py's `RunOutputSection`, environment tasks its `LoopSection`.
"""
