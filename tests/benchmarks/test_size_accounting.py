"""benchmarks/code/size_accounting.py, issue 23's size measurement: what counts as a code line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "code" / "size_accounting.py"


def _script():
    spec = importlib.util.spec_from_file_location("size_accounting", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = '''"""A module docstring
over two lines."""

import os  # a comment after code is a code line

# a comment line


class A:
    """A class docstring."""

    x = (1,
         2)

    def f(self):
        """A function
        docstring."""
        s = """a string that is
        no docstring"""
        return s
'''


def test_code_lines_leave_out_blank_lines_comments_and_docstrings():
    lines, code = _script().count_lines(SOURCE)
    assert lines == 20
    # import, class, x = (two lines), def, s = (two lines), return
    assert code == 8
