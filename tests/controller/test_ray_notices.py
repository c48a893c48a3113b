"""The embedded Ray starts without Ray's "Token authentication is enabled" WARNING line
reaching the user (issue 26), and still with token authentication on."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import hybridflow

SOURCE_ROOT = str(Path(hybridflow.__file__).resolve().parents[1])  # the hybridflow under test, in the child too


def test_the_token_auth_notice_is_dropped_and_the_cluster_keeps_its_authentication(tmp_path):
    code = textwrap.dedent('''
        import ray
        from ray._raylet import AuthenticationMode, get_authentication_mode
        from hybridflow.controller.ray_runtime import init_ray
        init_ray(num_cpus=1)
        print("mode:", get_authentication_mode() == AuthenticationMode.TOKEN)
        ray.shutdown()
    ''')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": SOURCE_ROOT}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "mode: True" in out.stdout  # token authentication on, as Ray's default for a local instance
    assert "Token authentication is enabled" not in out.stdout + out.stderr
    assert (tmp_path / ".ray" / "auth_token").is_file()  # Ray made its token as it always does
