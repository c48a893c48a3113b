"""CartPole that writes down the node it runs on (its namespace's eth0 address, or
"local"), so a test sees where environment PPO placed its runners."""

from __future__ import annotations

import os

import psutil
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class NodeCartPole(CartPoleEnv):
    def __init__(self, record: str, **kwargs) -> None:
        super().__init__(**kwargs)
        addresses = [a.address for a in psutil.net_if_addrs().get("eth0", []) if a.family == 2]  # AF_INET
        with open(record, "a") as f:
            f.write(f"{addresses[0] if addresses else 'local'} {os.getpid()}\n")
