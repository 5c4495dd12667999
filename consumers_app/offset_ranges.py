"""Sets of queue offsets as sorted ``[start, end)`` ranges: what a consumer reports it
consumed (client/base.py) and what the lab compares to count duplicates (lab/handoff.py)."""


def merge_ranges(ranges: list[list[int]]) -> list[list[int]]:
    """Sort ``ranges`` in place and join those that touch or overlap."""
    ranges.sort()
    merged = [ranges[0]]
    for start, end in ranges[1:]:
        if start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def covered(start: int, end: int, ranges) -> int:
    """How many offsets of [start, end) lie in the union of ``ranges``."""
    parts = sorted((max(start, s), min(end, e)) for s, e, *_ in ranges if s < end and e > start)
    total, reach = 0, start
    for s, e in parts:
        s = max(s, reach)
        if e > s:
            total += e - s
            reach = e
    return total
