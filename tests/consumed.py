"""Duplicates counted the plain way, from the consumers' own ``consume`` events (their
consumed offset ranges), to check the lab's hand-off figures (consumers_app/lab/handoff.py)
against: per moved queue, the offsets the new owner consumed after taking it that the old
owner had consumed too."""


def offsets_by_client(consume_events: list[dict], queue: str, since_ts: int | None = None,
                      client: str | None = None, exclude: str | None = None) -> dict[str, set[int]]:
    """client -> the offsets of ``queue`` (BROKER:QID of the event's topic) it reported."""
    out: dict[str, set[int]] = {}
    for e in consume_events:
        if (client and e["client_id"] != client) or (exclude and e["client_id"] == exclude):
            continue
        if since_ts is not None and e["ts"] < since_ts:
            continue
        for start, end in (e.get("ranges") or {}).get(queue, ()):
            out.setdefault(e["client_id"], set()).update(range(start, end))
    return out


def duplicates_of_move(consume_events: list[dict], move: dict) -> int:
    """Offsets the move's new owner consumed since it took the queue that its old owner(s)
    consumed as well."""
    by = offsets_by_client(consume_events, move["queue"])
    new = offsets_by_client(consume_events, move["queue"], since_ts=move["added_ts"], client=move["to"]).get(move["to"], set())
    old = set().union(*(by.get(c, set()) for c in move["from"]))
    return len(new & old)
