"""What the lab lets a user do to its consumers: the one list the engine, the API and
the page share (with the line the page shows for each)."""

MODES = ("push", "lite_pull", "pop")

#: action -> what it does, in one line (shown next to the page's buttons).
CONSUMER_ACTIONS = {
    "stop": "graceful shutdown: offsets persisted, goodbye sent; the group rebalances at once",
    "kill": "the process dies: its connection closes, the broker drops it at once and tells the group",
    "hang": "the listener blocks; heartbeats go on, so it keeps its queues and nothing moves",
    "cut": "network partition: no heartbeats, no close; it keeps its queues until the broker expires it",
    "resume": "undo hang and cut",
    "slow": "sleep this long in the listener for every message",
    "fail": "this share of messages returns RECONSUME_LATER",
}
