"""Loaded by every Python process whose PYTHONPATH starts with this folder (benchmarks/envs/one_task_model.py
sets it for one run): with HF_TRACE_LOSS=<file>, records the hybridflow frames on the stack when a PPO
loss function starts, and on the controller's worker-group calls, one JSON line each, appended to the file."""

import json
import os
import sys
import threading

_OUT = os.environ.get("HF_TRACE_LOSS")
LOSS_NAMES = set(os.environ.get("HF_TRACE_LOSS_NAMES", "ppo_clip_loss,ppo_loss").split(","))
CALL_NAMES = {"_call"}  # controller/worker_group.py: where a worker-group call leaves the controller
_seen: set = set()


def _stack(frame):
    out = []
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/hybridflow/" in path and "/benchmarks/" not in path:
            out.append((path.rsplit("/hybridflow/", 1)[1], frame.f_code.co_name, frame.f_lineno))
        frame = frame.f_back
    return out[::-1]  # outermost first


def _write(record):
    with open(_OUT, "a") as f:
        f.write(json.dumps(record) + "\n")


def _trace(frame, event, arg):
    code = frame.f_code
    name = code.co_name
    if name in LOSS_NAMES and "/hybridflow/algorithms/" in code.co_filename.replace(os.sep, "/"):
        if ("loss", os.getpid()) not in _seen:
            _seen.add(("loss", os.getpid()))
            _write({"pid": os.getpid(), "kind": "loss", "function": name, "stack": _stack(frame)})
    elif name in CALL_NAMES and code.co_filename.replace(os.sep, "/").endswith("hybridflow/controller/worker_group.py"):
        method = frame.f_locals.get("method")
        if (method, os.getpid()) not in _seen:
            _seen.add((method, os.getpid()))
            _write({"pid": os.getpid(), "kind": "call", "method": method, "stack": _stack(frame)})
    return None


if _OUT:
    sys.settrace(_trace)
    threading.settrace(_trace)
