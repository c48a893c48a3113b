"""Partial credit: the share of a response's characters that are digits."""


def digit_share(solution_str: str) -> float:
    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))
