import csv
import io
import json
from statistics import mean, median


def parse_csv(text: str) -> list[dict[str, str]]:
    """Rows of a CSV document with a header line, as dictionaries."""
    return list(csv.DictReader(io.StringIO(text)))


def group_by(rows: list[dict[str, str]], key: str) -> dict[str, list[dict[str, str]]]:
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return groups


def summarize_scores(rows: list[dict[str, str]]) -> dict[str, float]:
    scores = [float(row["score"]) for row in rows]
    if not scores:
        return {"count": 0, "mean": 0.0, "median": 0.0, "best": 0.0}
    return {"count": len(scores), "mean": round(mean(scores), 2), "median": median(scores), "best": max(scores)}


def to_json_lines(rows: list[dict[str, str]]) -> str:
    return "\n".join(json.dumps(row, sort_keys=True) for row in rows)


def merge_dicts(*dicts: dict) -> dict:
    """Later dictionaries win on equal keys; nested dictionaries are merged recursively."""
    merged: dict = {}
    for d in dicts:
        for key, value in d.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge_dicts(merged[key], value)
            else:
                merged[key] = value
    return merged


def flatten(nested: list) -> list:
    """Flatten arbitrarily nested lists into one list, keeping the order."""
    out = []
    for item in nested:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out


def pairwise_differences(values: list[float]) -> list[float]:
    """Differences between neighbours: [b - a for each consecutive a, b]."""
    return [b - a for a, b in zip(values, values[1:])]


DATA = """name,team,score
Ada,red,91
Ben,blue,78
Chloe,red,85
Dev,blue,88
"""

if __name__ == "__main__":
    rows = parse_csv(DATA)
    for team, members in sorted(group_by(rows, "team").items()):
        print(team, summarize_scores(members))
