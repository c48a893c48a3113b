"""Environment tasks (PPO, SAC and your registered environment algorithms on Gymnasium-style
environments), a config that names an `env`: the kind's part of the one lifecycle (part.py),
what the workers are built with (specs.py), the worker groups (groups.py), records and
console (records.py), checkpoint state (state.py). Their programs: trainer/programs/.
"""
