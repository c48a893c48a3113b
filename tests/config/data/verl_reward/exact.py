"""Full credit: the number after the last "####" is the ground truth (GSM8K's answer format)."""


def compute_score(solution_str: str, ground_truth: str) -> float:
    answer = solution_str.rsplit("####", 1)[-1].strip().replace(",", "") if "####" in solution_str else None
    return 1.0 if answer == str(ground_truth) else 0.0
