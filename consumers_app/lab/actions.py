"""What a user can ask the lab to do: the one table of actions and their parameters.

The controller dispatches bus requests through it (``checked_request``) and the control API
(dashboard/api.py) derives what a web request must look like from it, so the two cannot
drift (the web tests run the controller itself, on a fake broker: tests/fake_lab.py).

Each ``Action`` lists its ``Param``s in the order of its handler's signature
(``LabController.action_<name>``) and in the order they are checked. A parameter speaks
in two voices, both of them contracts that tests assert word for word:

* the lab's (``check``): run on every bus request before the handler, against the lab's
  state where it must (an unknown group, a consumer that is gone); its ``LabError`` is
  the answer, e.g. "rate must be between 0 and 50000, not -1";
* the web's (``web``, ``kind``, ``choices``, ``rule``): the shape an HTTP request must
  have, refused with a 400 before the bus is asked, e.g. "'rate' must be >= 0 (messages
  per second)". A parameter without ``web`` is not offered over HTTP.

Checks that weigh one parameter against the running lab beyond that (limits, a group's
mode against the client asked for, a broker's queue count) stay in the handlers.
"""
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from consumers_app import allocate

from .bus import LabError
from .peers import OURS, available_clients

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

MAX_RATE = 50_000      # messages per second of one topic's producer
MAX_BURST = 100_000    # messages of one burst


# ---------------------------------------------------------------- the web's kinds of JSON value

# Past this a number is not a rate or a count but an attack on float conversion (10**400).
MAX_MAGNITUDE = 10**15


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_MAGNITUDE


def _is_number(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value) and abs(value) <= MAX_MAGNITUDE
    return _is_int(value)


def _is_name(value) -> bool:
    return isinstance(value, str) and value.strip() != ""


#: kind -> (does a JSON value have it, how a refusal names it)
KINDS = {
    "name": (_is_name, "a non-empty string"),
    "int": (_is_int, "an integer (at most 10**15 in size)"),
    "number": (_is_number, "a number (finite, at most 10**15 in size)"),
}


@dataclass(frozen=True)
class Rule:
    """A bound a web request's value must keep, with the refusal's text ({value} is filled in)."""
    holds: Callable[[Any], bool]
    message: str


# ---------------------------------------------------------------- the lab's checks
# Each takes (value, lab, params): ``lab`` is whatever answers the request (it has the
# LabState as ``lab.state``), ``params`` the request's params. It returns the value the
# handler gets, or raises LabError and nothing changes.

GROUP_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,120}$")   # RocketMQ's valid group/topic characters
GROUP_NAME_MAX = 120   # its retry topic, %RETRY% + the name, must fit RocketMQ's 127 characters of a topic


def group_name_problem(name) -> str | None:
    """What is wrong with ``name`` as a group name, naming the rule it breaks; None: nothing."""
    if not isinstance(name, str) or not name:
        return f"a group name is 1 to {GROUP_NAME_MAX} characters, not {name!r}"
    if len(name) > GROUP_NAME_MAX:
        return (f"group name is {len(name)} characters long: at most {GROUP_NAME_MAX} "
                f"(its retry topic %RETRY%NAME must fit RocketMQ's 127)")
    bad = sorted({ch for ch in name if not GROUP_NAME.match(ch)})
    if bad:
        return (f"group name {name!r} has {' '.join(map(repr, bad))}: use only letters, digits, '_', '-', '%' or '|' "
                f"(at most {GROUP_NAME_MAX} characters)")
    return None


def valid_group_name(name, lab=None, params=None) -> str:
    if (problem := group_name_problem(name)) is not None:
        raise LabError(problem)
    return name


def not_observed(group) -> None:
    if group.observed:
        raise LabError(f"group {group.name} is observed, not run by the lab: it is read-only")


def known_group(name, lab, params=None) -> str:
    """A group the lab runs (an observed one is read-only)."""
    group = lab.state.groups.get(name) if isinstance(name, str) else None
    if group is None:
        raise LabError(f"unknown group {name!r}; known: {', '.join(sorted(lab.state.groups)) or 'none'}")
    not_observed(group)
    return name


def known_topic(topic, lab, params=None) -> str:
    if topic not in lab.state.topics:
        raise LabError(f"unknown topic {topic!r}; known: {', '.join(sorted(lab.state.topics)) or 'none'}")
    return topic


def known_broker(broker, lab, params=None) -> str:
    if broker not in lab.state.brokers:
        raise LabError(f"unknown broker {broker!r}; known: {', '.join(sorted(lab.state.brokers))}")
    return broker


def live_consumer(client_id, lab, params=None) -> str:
    """A consumer that is alive, in a group the lab runs."""
    client = lab.state.clients.get(client_id) if isinstance(client_id, str) else None
    if client is None:
        raise LabError(f"unknown consumer {client_id!r}")
    if not client.alive:
        raise LabError(f"consumer {client_id} is {client.status}")
    not_observed(lab.state.groups[client.group])
    return client_id


def disabled(lab, control: str) -> str | None:
    """Why ``control`` is off on the cluster the lab is attached to (None: it is on)."""
    return lab.state.cluster.get("disabled", {}).get(control)


def refuse_if_disabled(lab, control: str) -> None:
    reason = disabled(lab, control)
    if reason:
        raise LabError(reason)


def valid_mode(mode, lab, params=None) -> str:
    if mode not in MODES:
        raise LabError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if mode == "pop":
        refuse_if_disabled(lab, "pop")
    return mode


def valid_strategy(name, options=None) -> tuple[str, dict]:
    """(the strategy's own name, as consumers report it, e.g. MACHINE_ROOM_NEARBY-AVG; its options)."""
    if not isinstance(options, (dict, type(None))):
        raise LabError(f"options must be an object, not {options!r}")
    if not isinstance(name, str) or name.strip().upper().split("-")[0] not in allocate.STRATEGY_NAMES:
        raise LabError(f"unknown strategy {name!r}; valid: {', '.join(allocate.STRATEGY_NAMES)}")
    options = dict(options or {})
    try:
        built = allocate.get_strategy(name, **dict(options))
    except (ValueError, TypeError) as exc:
        raise LabError(f"strategy {name}: {exc}") from None
    return built.name, options


def _strategy(name, lab, params) -> str:
    return valid_strategy(name, params.get("options"))[0]


def _options(options, lab, params) -> dict:
    return dict(options or {})   # its type was checked with the strategy, which it builds


def _consumer_action(action, lab, params) -> str:
    if action not in CONSUMER_ACTIONS:
        raise LabError(f"unknown consumer action {action!r}; valid: {', '.join(CONSUMER_ACTIONS)}")
    return action


def _installed_client(client, lab, params) -> str:
    if client not in available_clients():
        raise LabError(f"unknown or uninstalled client {client!r}; available: {', '.join(available_clients())}")
    return client


def _boolean(name: str):
    def check(value, lab, params):
        if not isinstance(value, bool):
            raise LabError(f"{name} must be true or false, not {value!r}")
        return value
    return check


def between(name: str, minimum, maximum, integer: bool = False, not_zero: str = ""):
    """A number (or a number's text) in [minimum, maximum]; whole with ``integer``; refused
    with ``not_zero`` when 0."""
    def check(value, lab, params):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise LabError(f"{name} must be a number, not {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise LabError(f"{name} must be a number, not {value!r}") from None
        if not math.isfinite(number) or not minimum <= number <= maximum:
            raise LabError(f"{name} must be between {minimum} and {maximum}, not {value!r}")
        if integer:
            if number != int(number):
                raise LabError(f"{name} must be a whole number, not {value!r}")
            number = int(number)
        if not_zero and number == 0:
            raise LabError(not_zero)
        return number
    return check


# ---------------------------------------------------------------- the table

NOT_GIVEN = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: str = "any"              # the JSON kind a web request must give (KINDS)
    required: bool = True          # a bus request must carry it
    default: Any = NOT_GIVEN       # the handler's value when it is not given
    check: Callable | None = None  # the lab's check (see above)
    when: str | None = None        # only with this consumer action (slow's ms, fail's ratio)
    # How a web request carries it: "path" (the URL), "body" (JSON), "query"; None: not offered.
    web: str | None = None
    web_required: bool | None = None   # None: as on the bus
    web_default: Any = NOT_GIVEN       # a query parameter's value when the URL leaves it out
    choices: Callable[[], Sequence[str]] | None = None   # asked when checked: installed clients vary
    rule: Rule | None = None

    @property
    def needed_on_the_web(self) -> bool:
        return self.required if self.web_required is None else self.web_required

    def applies(self, params: dict) -> bool:
        return self.when is None or params.get("action") == self.when


@dataclass(frozen=True)
class Action:
    name: str
    params: tuple[Param, ...] = ()
    control: str | None = None   # the cluster control it needs (off on some attached clusters)
    doc: str = ""

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def web_params(self, where: str, params: dict | None = None) -> list[Param]:
        """What a web request carries in ``where`` ("path", "body", "query"), for these params."""
        return [p for p in self.params if p.web == where and (params is None or p.applies(params))]


def _group(check=known_group) -> Param:
    return Param("group", "name", check=check, web="path")


_STRATEGY_CHOICES = lambda: allocate.STRATEGY_NAMES   # noqa: E731
_MODE_CHOICES = lambda: MODES                         # noqa: E731

ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("state", doc="the snapshot"),
    Action("health", doc="/healthz: healthy while the broker process is up"),
    Action("set_strategy", (
        _group(),
        Param("strategy", "name", check=_strategy, web="body", choices=_STRATEGY_CHOICES),
        Param("options", required=False, default=None, check=_options),
    ), doc="switch a group's allocation strategy"),
    Action("preview_strategy", (
        _group(),
        Param("strategy", "name", check=_strategy, web="query", choices=_STRATEGY_CHOICES),
    ), doc="what switching the strategy would move (read-only)"),
    Action("rebalance", (
        _group(),
        Param("rebalance_id", "int", web="path"),
    ), doc="one recent rebalance with its hand-offs (read-only)"),
    Action("lag_series", (
        _group(),
        Param("seconds", "int", web="query", web_default=300,
              rule=Rule(lambda v: 1 <= v <= 900, "'seconds' must be between 1 and 900, not {value}")),
    ), doc="the group's lag, a point a second (read-only)"),
    Action("view_at", (
        _group(),
        Param("ts", "int", web="query",
              rule=Rule(lambda v: 0 <= v <= 2**53, f"'ts' must be between 0 and {2**53}, not {{value}}")),
    ), doc="the group's queues as they were at ts (read-only)"),
    Action("set_mode", (
        _group(),
        Param("mode", "name", check=valid_mode, web="body", choices=_MODE_CHOICES),
    ), doc="restart a group's consumers in another consume mode"),
    Action("add_consumer", (
        _group(check=valid_group_name),
        # mode, topic and strategy are the handler's to check: they must agree with an existing group.
        Param("mode", "name", required=False, default=None, web="body", web_required=True, choices=_MODE_CHOICES),
        Param("topic", required=False, default=None),
        Param("strategy", required=False, default=None),
        Param("client", "name", required=False, default=OURS, check=_installed_client, web="body",
              choices=available_clients),
    ), doc="start a consumer (ours, or another client's) in a group, new or existing"),
    Action("consumer", (
        Param("client_id", "name", check=live_consumer, web="path"),
        Param("action", "name", check=_consumer_action, web="path"),
        Param("ms", "int", required=False, default=None, when="slow", web="body", web_required=True,
              check=between("ms", 0, 60_000, integer=True), rule=Rule(lambda v: v >= 0, "'ms' must be >= 0")),
        Param("ratio", "number", required=False, default=None, when="fail", web="body", web_required=True,
              check=between("ratio", 0.0, 1.0),
              rule=Rule(lambda v: 0 <= v <= 1, "'ratio' must be between 0 and 1")),
    ), doc="inject a fault into a consumer, or stop it (CONSUMER_ACTIONS)"),
    Action("producer_rate", (
        Param("topic", "name", check=known_topic, web="body"),
        Param("rate", "number", check=between("rate", 0, MAX_RATE), web="body",
              rule=Rule(lambda v: v >= 0, "'rate' must be >= 0 (messages per second)")),
    ), doc="a topic's producer's steady rate"),
    Action("producer_burst", (
        Param("topic", "name", check=known_topic, web="body"),
        Param("count", "int", check=between("count", 1, MAX_BURST, integer=True), web="body",
              rule=Rule(lambda v: v >= 1, "'count' must be >= 1")),
    ), doc="send this many messages at once"),
    Action("queues", (
        Param("topic", "name", check=known_topic, web="path"),
        Param("delta", "int", check=between("delta", -1024, 1024, integer=True, not_zero="delta must not be 0"),
              web="body",
              rule=Rule(lambda v: v != 0, "'delta' must not be 0 (positive adds queues, negative removes them)")),
        # Checked by the handler: left out, it is the topic's first broker.
        Param("broker", "name", required=False, default=None, web="body"),
    ), control="queues", doc="add or remove a topic's queues on a broker"),
    Action("broker", (
        Param("broker", "name", check=known_broker, web="path"),
        Param("online", "bool", check=_boolean("online"), web="path"),
    ), control="broker_online", doc="take a broker offline or bring it back"),
    Action("observe", (
        Param("group", "name", check=valid_group_name, web="body"),
    ), doc="watch a group the lab did not start, read-only"),
)}


def checked_request(lab, action, params) -> tuple[Action, dict]:
    """The action and its params as its handler takes them, or LabError (nothing changed):
    unknown action, missing or unexpected params, then each param's check in order."""
    spec = ACTIONS.get(action) if isinstance(action, str) else None
    if spec is None:
        raise LabError(f"unknown action {action!r}; valid: {', '.join(sorted(ACTIONS))}")
    if not isinstance(params, dict):
        raise LabError("params must be an object")
    names = {p.name for p in spec.params}
    for name in params:   # the words Python's own binding of the handler's arguments used
        if name not in names:
            raise LabError(f"{action}: got an unexpected keyword argument {name!r}")
    for p in spec.params:
        if p.required and p.name not in params:
            raise LabError(f"{action}: missing a required argument: {p.name!r}")
    if spec.control is not None:
        refuse_if_disabled(lab, spec.control)
    checked = dict(params)
    for p in spec.params:
        # One left out is checked as its default: slow without ms is refused, options become {}.
        if p.check is not None and p.applies(checked) and (p.name in params or p.default is not NOT_GIVEN):
            checked[p.name] = p.check(params.get(p.name, p.default), lab, checked)
    return spec, checked
