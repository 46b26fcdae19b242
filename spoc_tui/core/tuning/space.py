"""Tuning studies, the pure part: search spaces, conditions, objectives and constraints.

A search space is a TOML file naming server flags (``vllm serve`` spelling, without the dashes)
with their candidate values, plus conditions a configuration must meet to be worth starting::

    [fixed]                                  # passed to every trial, usable in conditions
    max-model-len = 4096

    [flags.max-num-seqs]
    pow2 = [16, 512]                         # 16, 32, ..., 512
    default = 256                            # the server's own default (seeded first trial)

    [flags.gpu-memory-utilization]
    range = [0.80, 0.95]
    step = 0.05
    default = 0.9

    [flags.enable-chunked-prefill]
    choices = [true, false]                  # booleans become --x / --no-x
    default = true

    [[conditions]]
    when = { enable-chunked-prefill = false }
    require = "max-num-batched-tokens >= max-model-len"

Every flag has a finite list of values, so a space has a size, duplicates are well defined and
a benchmark can try every configuration.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spoc_tui.core.errors import InputError
from spoc_tui.core.files import FileReadError, require_regular
from spoc_tui.core.jsonsafe import finite_number
from spoc_tui.core.ramp.knee import Knee
from spoc_tui.core.ramp.sla import METRICS, Limit
from spoc_tui.core.ramp.steps import StepSummary

Value = bool | int | float | str
Config = dict[str, Value]

_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq, "!=": operator.ne}
_REQUIRE = re.compile(r"^\s*([a-z0-9.-]+)\s*(>=|<=|==|!=|>|<)\s*([a-z0-9.-]+)\s*$")
MAX_VALUES = 4096
DEFAULT_SPACE = Path(__file__).resolve().parents[2] / "tune" / "default_space.toml"


class SpaceError(InputError, ValueError):
    """A search space (or a configuration given for it) that cannot be used."""


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    values: tuple[Value, ...]
    default: Value | None = None
    kind: str = "choices"
    """choices, pow2 or range: how the sampler sees it (ordered numbers keep their order)."""

    @property
    def by_index(self) -> bool:
        """Decimal ranges are searched by position in the list (exact values, no float steps)."""
        return self.kind == "range" and not all(isinstance(v, int) for v in self.values)

    @property
    def sampler_name(self) -> str:
        """The parameter's name in the Optuna study (powers of two are searched by exponent)."""
        if self.kind == "pow2":
            return f"log2({self.name})"
        return f"{self.name} (index)" if self.by_index else self.name

    def encode(self, value: Value) -> Value:
        if self.kind == "pow2":
            return int(math.log2(float(value)))
        if self.by_index:
            return min(range(len(self.values)), key=lambda i: abs(float(self.values[i]) - float(value)))
        return value

    def decode(self, raw: Value) -> Value:
        if self.kind == "pow2":
            return int(2 ** int(raw))
        if self.by_index:
            return self.values[int(raw)]
        return raw

    @property
    def is_bool(self) -> bool:
        return all(isinstance(v, bool) for v in self.values)

    def argv(self, value: Value) -> list[str]:
        if isinstance(value, bool):
            return [f"--{self.name}" if value else f"--no-{self.name}"]
        return [f"--{self.name}", _text(value)]


def _text(v: Value) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


@dataclass(frozen=True, slots=True)
class Condition:
    when: tuple[tuple[str, Value], ...]
    left: str
    op: str
    right: str

    def __str__(self) -> str:
        req = f"{self.left} {self.op} {self.right}"
        if not self.when:
            return req
        cond = " and ".join(f"{k} = {_text(v).lower() if isinstance(v, bool) else _text(v)}" for k, v in self.when)
        return f"when {cond}: {req}"

    def names(self) -> set[str]:
        out = {k for k, _ in self.when}
        for side in (self.left, self.right):
            if not _is_number(side):
                out.add(side)
        return out

    def holds(self, values: Mapping[str, Value]) -> bool:
        if any(values.get(k) != v for k, v in self.when):
            return True
        a, b = self._operand(self.left, values), self._operand(self.right, values)
        return bool(_OPS[self.op](a, b))

    @staticmethod
    def _operand(token: str, values: Mapping[str, Value]) -> float:
        if _is_number(token):
            return float(token)
        v = values[token]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SpaceError(f"condition compares {token!r}, which is not a number")
        return float(v)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


@dataclass
class Space:
    params: tuple[Param, ...]
    fixed: dict[str, Value] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()
    source: str = "built-in"
    notes: list[str] = field(default_factory=list)
    """Things the user should know (a condition left out because a value was unknown)."""
    known: dict[str, Value] = field(default_factory=dict)
    """Values fixed by the launch command that conditions name (not passed again as flags)."""
    pending: tuple[Condition, ...] = ()
    """Built-in conditions waiting for a value the server will tell (max-model-len)."""

    def learn(self, name: str, value: Value) -> list[Condition]:
        """A value learnt from a running server; returns the conditions that now apply."""
        self.known.setdefault(name, value)
        ready = [
            c for c in self.pending if all(n in self.names or n in self.known or n in self.fixed for n in c.names())
        ]
        self.pending = tuple(c for c in self.pending if c not in ready)
        self.conditions = (*self.conditions, *ready)
        return ready

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def size(self) -> int:
        return math.prod(len(p.values) for p in self.params)

    def all_configs(self) -> Iterator[Config]:
        for combo in itertools.product(*(p.values for p in self.params)):
            yield dict(zip(self.names, combo, strict=True))

    def violated(self, config: Mapping[str, Value]) -> Condition | None:
        """The first condition the configuration breaks (None: it may be started)."""
        values = {**self.known, **self.fixed, **config}
        for c in self.conditions:
            if not c.holds(values):
                return c
        return None

    def encode(self, config: Mapping[str, Value]) -> dict[str, Value]:
        """A configuration as the sampler's parameters (for enqueueing)."""
        return {p.sampler_name: p.encode(config[p.name]) for p in self.params if p.name in config}

    def decode(self, params: Mapping[str, Value]) -> Config:
        """The sampler's parameters (of a stored trial) as a configuration."""
        return {p.name: p.decode(params[p.sampler_name]) for p in self.params if p.sampler_name in params}

    def defaults(self) -> Config:
        """The server's defaults, for the flags whose default the space names."""
        return {p.name: p.default for p in self.params if p.default is not None}

    def argv(self, config: Mapping[str, Value]) -> list[str]:
        """The flags for a configuration: fixed ones first, then the searched ones in space order."""
        out: list[str] = []
        for k, v in self.fixed.items():
            out += Param(k, (v,)).argv(v)
        for p in self.params:
            if p.name in config:
                out += p.argv(config[p.name])
        return out

    def key(self, config: Mapping[str, Value]) -> tuple[tuple[str, Value], ...]:
        """Identity of a configuration, for duplicate detection (1 and 1.0 are the same)."""
        return tuple((n, _norm(config[n])) for n in self.names if n in config)

    def parse_flags(self, text: str) -> Config:
        """``"--max-num-seqs 64 --no-enable-chunked-prefill"`` -> a configuration of this space.

        Flags the space does not search are refused; values must be among the candidates.

        Raises:
            SpaceError: naming the flag and the allowed values.
        """
        try:
            tokens = shlex.split(text)
        except ValueError as e:
            raise SpaceError(f"cannot read {text!r}: {e}") from None
        out: Config = {}
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if not tok.startswith("--"):
                raise SpaceError(f"{tok!r} is not a flag (in {text!r})")
            name, eq, val = tok[2:].partition("=")
            neg = name.startswith("no-") and name[3:] in self.names and self.param(name[3:]).is_bool
            if neg or (name in self.names and self.param(name).is_bool and not eq):
                pname = name[3:] if neg else name
                out[pname] = not neg
                i += 1
                continue
            if name not in self.names:
                raise SpaceError(f"--{name} is not a flag of the search space ({', '.join(self.names)})")
            if not eq:
                if i + 1 >= len(tokens):
                    raise SpaceError(f"--{name} needs a value")
                val = tokens[i + 1]
                i += 1
            i += 1
            out[name] = self._coerce(self.param(name), val)
        return out

    @staticmethod
    def _coerce(p: Param, raw: str) -> Value:
        for v in p.values:
            if _text(v) == raw or (not isinstance(v, (bool, str)) and _is_number(raw) and float(raw) == float(v)):
                return v
        raise SpaceError(f"--{p.name} {raw} is not one of the space's values: {', '.join(_text(v) for v in p.values)}")


def _norm(v: Value) -> Value:
    if isinstance(v, bool) or isinstance(v, str):
        return v
    return float(v)


def _is_value(v: object) -> bool:
    """A flag's value: a boolean, a string or a finite number."""
    return isinstance(v, (bool, str)) or finite_number(v)


def _values(name: str, spec: Mapping[str, object]) -> tuple[Value, ...]:
    kinds = [k for k in ("choices", "pow2", "range") if k in spec]
    if len(kinds) != 1:
        raise SpaceError(
            f"flag {name!r}: give exactly one of choices = [...], pow2 = [low, high] or range = [low, high] (with step)"
        )
    kind = kinds[0]
    raw = spec[kind]
    if kind == "choices":
        if not isinstance(raw, list) or not raw:
            raise SpaceError(f"flag {name!r}: choices must be a non-empty list")
        for v in raw:
            if not _is_value(v):
                raise SpaceError(f"flag {name!r}: choice {v!r} is not a number, string or boolean")
        if len({_norm(v) for v in raw}) != len(raw):
            raise SpaceError(f"flag {name!r}: choices repeat a value")
        return tuple(raw)
    if not (isinstance(raw, list) and len(raw) == 2 and all(finite_number(x) for x in raw)):
        raise SpaceError(f"flag {name!r}: {kind} must be [low, high] numbers")
    lo, hi = raw
    if lo > hi:
        raise SpaceError(f"flag {name!r}: {kind} low {lo} is above high {hi}")
    if kind == "pow2":
        if not (isinstance(lo, int) and isinstance(hi, int)) or lo < 1:
            raise SpaceError(f"flag {name!r}: pow2 bounds must be positive integers")
        e0, e1 = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
        if e0 > e1:
            raise SpaceError(f"flag {name!r}: no power of two between {lo} and {hi}")
        return tuple(2**e for e in range(e0, e1 + 1))
    step = spec.get("step")
    if not finite_number(step) or step <= 0:
        raise SpaceError(f"flag {name!r}: range needs a positive step (every flag has a finite list of values)")
    span = (hi - lo) / step
    n = math.floor(span + 1e-9) + 1 if span < MAX_VALUES else MAX_VALUES + 1
    if n > MAX_VALUES:
        raise SpaceError(f"flag {name!r}: {n} values is too many (at most {MAX_VALUES}); use a larger step or pow2")
    if all(isinstance(x, int) for x in (lo, hi, step)):
        return tuple(int(lo + i * step) for i in range(n))
    return tuple(round(lo + i * step, 10) for i in range(n))


def parse_space(text: str, source: str = "<space>", known: Mapping[str, Value] | None = None) -> Space:
    """Read a search space.

    ``known`` are values fixed elsewhere (flags in the launch command) that conditions may
    name. A condition naming something unknown is an error in a user's file; in the built-in
    space it is left out with a note.

    Raises:
        SpaceError: naming the file and what is wrong.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpaceError(f"{source}: not valid TOML: {e}") from None
    unknown = set(doc) - {"flags", "fixed", "conditions"}
    if unknown:
        raise SpaceError(f"{source}: unknown section(s) {', '.join(sorted(unknown))}; known: flags, fixed, conditions")
    flags = doc.get("flags")
    if not isinstance(flags, dict) or not flags:
        raise SpaceError(f"{source}: no [flags.NAME] tables; a space needs at least one flag to search")
    params: list[Param] = []
    try:
        for name, spec in flags.items():
            if not _NAME.match(name):
                raise SpaceError(f"flag {name!r}: write flags as vllm spells them without dashes, e.g. max-num-seqs")
            if not isinstance(spec, dict):
                raise SpaceError(f"flag {name!r}: expected a table")
            extra = set(spec) - {"choices", "pow2", "range", "step", "default"}
            if extra:
                raise SpaceError(f"flag {name!r}: unknown key(s) {', '.join(sorted(extra))}")
            values = _values(name, spec)
            default = spec.get("default")
            if default is not None:
                if not _is_value(default):
                    raise SpaceError(f"flag {name!r}: default {default!r} is not a number, string or boolean")
                match = [
                    v for v in values if isinstance(v, bool) == isinstance(default, bool) and _norm(v) == _norm(default)
                ]
                if not match:
                    raise SpaceError(f"flag {name!r}: default {default!r} is not one of its values")
                default = match[0]
            kind = next(k for k in ("choices", "pow2", "range") if k in spec)
            params.append(Param(name, values, default, kind))
    except SpaceError as e:
        raise SpaceError(f"{source}: {e}") from None
    fixed = doc.get("fixed", {})
    if not isinstance(fixed, dict):
        raise SpaceError(f"{source}: [fixed] must be a table of flag = value")
    for k, v in fixed.items():
        if not _NAME.match(k) or not isinstance(v, (bool, int, float, str)):
            raise SpaceError(f"{source}: [fixed] {k} = {v!r}: expected a flag name and a number, string or boolean")
        if k in flags:
            raise SpaceError(f"{source}: {k} is both searched and fixed")
    space = Space(tuple(params), dict(fixed), (), source)
    conds: list[Condition] = []
    available = {**(known or {}), **fixed}
    raw_conds = doc.get("conditions", [])
    if not isinstance(raw_conds, list):
        raise SpaceError(f"{source}: conditions must be a list of [[conditions]] tables")
    for i, c in enumerate(raw_conds, 1):
        if not isinstance(c, dict) or not isinstance(c.get("require"), str) or set(c) - {"when", "require"}:
            raise SpaceError(
                f'{source}: condition {i}: expected require = "a >= b" and optionally when = {{ flag = value }}'
            )
        m = _REQUIRE.match(c["require"])
        if not m:
            raise SpaceError(
                f"{source}: condition {i}: cannot read require = {c['require']!r}; write it like "
                f'"max-num-batched-tokens >= max-model-len"'
            )
        when = c.get("when", {})
        if not isinstance(when, dict):
            raise SpaceError(f"{source}: condition {i}: when must be a table like {{ enable-chunked-prefill = false }}")
        cond = Condition(tuple(when.items()), m.group(1), m.group(2), m.group(3))
        missing = sorted(n for n in cond.names() if n not in space.names and n not in available)
        if missing:
            msg = (
                f"condition {i} ({cond}) names {', '.join(missing)}, which is neither searched nor fixed nor "
                "in the launch command"
            )
            if source == "built-in":
                space.notes.append(msg + "; it applies once the first server reports it")
                space.pending = (*space.pending, cond)
                continue
            raise SpaceError(f"{source}: {msg}; add it to [fixed] or the launch command")
        conds.append(cond)
    space.conditions = tuple(conds)
    space.known = {n: available[n] for c in conds for n in c.names() if n not in space.names and n not in fixed}
    return space


def load_space(path: str | None, known: Mapping[str, Value] | None = None) -> Space:
    """The space in ``path``, or the built-in default space.

    Raises:
        SpaceError: unreadable file or bad content.
    """
    if path is None:
        return parse_space(DEFAULT_SPACE.read_text(), "built-in", known)
    p = Path(path)
    try:
        require_regular(p)
        text = p.read_text()
    except FileReadError as e:
        raise SpaceError(f"--space {path}: {e}") from None
    except OSError as e:
        raise SpaceError(f"--space {path}: {e.strerror or e}") from None
    return parse_space(text, str(p), known)


# -- objectives ----------------------------------------------------------------------------

THROUGHPUT = {"out_tok_s": "output tokens/s", "req_s": "requests/s", "goodput": "goodput (requests/s within SLA)"}
LATENCY_STATS = ("p50", "p90", "p95", "p99", "mean")


@dataclass(frozen=True, slots=True)
class Objective:
    name: str
    direction: str
    """max or min."""

    @property
    def label(self) -> str:
        if self.name == "knee_users":
            return "users within SLA"
        if self.name in THROUGHPUT:
            return THROUGHPUT[self.name]
        metric, stat = self.name.split("_")
        return f"{metric.upper()} {stat}"

    @property
    def is_latency(self) -> bool:
        return self.direction == "min"

    def __str__(self) -> str:
        return f"{self.direction}:{self.name}"


def _natural(name: str) -> str | None:
    if name == "knee_users" or name in THROUGHPUT:
        return "max"
    parts = name.split("_")
    if len(parts) == 2 and parts[0] in METRICS and parts[1] in LATENCY_STATS:
        return "min"
    return None


def parse_objectives(text: str) -> tuple[Objective, ...]:
    """``"max:out_tok_s,min:ttft_p99"`` (directions optional) -> two objectives.

    Raises:
        SpaceError: unknown names, contradictory directions, not exactly two objectives.
    """
    out: list[Objective] = []
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        direction, _, name = part.rpartition(":")
        name = name.strip().lower()
        natural = _natural(name)
        if natural is None:
            known = ", ".join(
                ["knee_users", *THROUGHPUT, "ttft_p99 (any of ttft/itl/tpot/e2e with p50/p90/p95/p99/mean)"]
            )
            raise SpaceError(f"unknown objective {name!r}; known: {known}")
        direction = direction.strip().lower() or natural
        if direction not in ("max", "min"):
            raise SpaceError(f"objective {part!r}: direction must be max or min")
        if direction != natural:
            raise SpaceError(
                f"objective {part!r}: {name} can only be {'maximised' if natural == 'max' else 'minimised'}"
            )
        if any(o.name == name for o in out):
            raise SpaceError(f"objective {name} is given twice")
        out.append(Objective(name, direction))
    if len(out) != 2:
        raise SpaceError(f'give two objectives, e.g. "max:out_tok_s,min:ttft_p99" (got {len(out)})')
    return tuple(out)


def reference_step(steps: Sequence[StepSummary], ref_users: int | None) -> StepSummary | None:
    """The step measured at the reference load (the last step when not given)."""
    if not steps:
        return None
    if ref_users is None:
        return steps[-1]
    for s in steps:
        if s.users == ref_users:
            return s
    return None


def objective_value(obj: Objective, steps: Sequence[StepSummary], knee: Knee, ref_users: int | None) -> float | None:
    """The objective's value from a trial's ramp; None when it was not measured."""
    if obj.name == "knee_users":
        return float(knee.meets_level or 0)
    ref = reference_step(steps, ref_users)
    if ref is None or not ref.requests:
        return None
    if obj.name == "out_tok_s":
        return ref.output_tokens_per_s
    if obj.name == "req_s":
        return ref.request_rate
    if obj.name == "goodput":
        return ref.goodput
    metric, stat = obj.name.split("_")
    return ref.latency.of(metric).stat(stat)


def objective_interval(
    obj: Objective, steps: Sequence[StepSummary], knee: Knee, ref_users: int | None
) -> tuple[list[float | None], int]:
    """The objective's 95 % interval and the sample it rests on, as the ramp's step reports them
    (ramp.json's shape: ``[lo, hi]``, a side None where the sample cannot bound it). For the knee:
    the bracket, the count that met the SLA and the first that did not."""
    if obj.name == "knee_users":
        return [knee.meets_level, knee.breaks_level], len(steps)
    ref = reference_step(steps, ref_users)
    if ref is None or not ref.requests:
        return [None, None], 0
    key = {"out_tok_s": "output_tokens_per_s", "req_s": "request_rate", "goodput": "goodput"}.get(obj.name)
    if key is not None:
        return list(getattr(ref.ci95, key)), ref.requests
    metric, stat = obj.name.split("_")
    fig = ref.latency.of(metric)
    return list(fig.interval(stat)), fig.n


def constraint_values(
    limits: Sequence[Limit],
    objectives: Sequence[Objective],
    steps: Sequence[StepSummary],
    knee: Knee,
    ref_users: int | None,
) -> dict[str, float]:
    """Optuna constraints by name (<= 0 is feasible): each SLA limit at the reference load as
    measured / limit - 1 (error rate: measured - limit). With a knee objective the SLA already
    decides the knee, so the only constraint is that the first step met it."""
    if any(o.name == "knee_users" for o in objectives):
        return {"first step meets the SLA": 0.0 if knee.meets_level else 1.0}
    ref = reference_step(steps, ref_users)
    out: dict[str, float] = {}
    for lim in limits:
        v = ref.value(lim) if ref is not None and ref.requests else None
        if v is None:
            out[str(lim)] = 1.0
        elif lim.metric == "error_rate":
            out[str(lim)] = v - lim.value
        else:
            out[str(lim)] = v / lim.value - 1.0
    return out


def reference_point(
    objectives: Sequence[Objective], limits: Sequence[Limit], points: Sequence[Sequence[float]]
) -> tuple[float, float]:
    """Hypervolume reference: 0 for what is maximised; for a latency, its SLA limit when the SLA
    names it, else 10 % beyond the worst value seen."""
    ref: list[float] = []
    for i, o in enumerate(objectives):
        if o.direction == "max":
            ref.append(0.0)
            continue
        lim = next((x.value for x in limits if x.key == o.name), None)
        if lim is not None:
            ref.append(lim)
        else:
            seen = [p[i] for p in points if p[i] == p[i]]
            ref.append(max(seen) * 1.1 if seen else 1.0)
    return ref[0], ref[1]


def command_line(template_argv: Sequence[str], flags: Sequence[str], port: int | None = None) -> list[str]:
    """The launch template with ``{flags}`` (a whole word) replaced and ``{port}`` filled in."""
    out: list[str] = []
    placed = False
    for tok in template_argv:
        if tok == "{flags}":
            out += flags
            placed = True
        elif port is not None:
            out.append(tok.replace("{port}", str(port)))
        else:
            out.append(tok)
    if not placed:
        out += flags
    return out


def parse_template(template: str) -> tuple[list[str], dict[str, Value]]:
    """Split a launch template and read the flag values it fixes (for conditions).

    Raises:
        SpaceError: no ``{port}``, unbalanced quotes, a shell construct.
    """
    try:
        argv = shlex.split(template)
    except ValueError as e:
        raise SpaceError(f"--launch: cannot read the command: {e}") from None
    if not argv:
        raise SpaceError('--launch is empty; e.g. "vllm serve MODEL --port {port} {flags}"')
    if not any("{port}" in t for t in argv):
        raise SpaceError('--launch must contain {port}, e.g. "vllm serve MODEL --port {port} {flags}"')
    for t in argv:
        if t in ("|", "&&", "||", ";", ">", "<", "&") or t.startswith(("$(", "`")):
            raise SpaceError(f"--launch runs without a shell; {t!r} would be passed to the server as an argument")
        if "{" in t.replace("{port}", "").replace("{flags}", ""):
            raise SpaceError(f"--launch: unknown placeholder in {t!r}; only {{port}} and {{flags}} are filled in")
    known: dict[str, Value] = {}
    for i, t in enumerate(argv):
        if t.startswith("--") and "{" not in t:
            name, eq, val = t[2:].partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                val = argv[i + 1]
            if val and _is_number(val):
                f = float(val)
                known[name] = int(f) if f.is_integer() else f
    return argv, known


def template_flags(argv: Sequence[str]) -> set[str]:
    """Flag names written in the launch template (``--x`` and ``--no-x`` both give ``x``)."""
    out = set()
    for t in argv:
        if t.startswith("--"):
            name = t[2:].partition("=")[0]
            out.add(name[3:] if name.startswith("no-") else name)
    return out
