"""Workload profiles: TOML files of length, turn and think-time distributions, or replays.

A profile describes one kind of conversation. Built-in ones live next to this file
(coding, logs, chatbot, mix, tuning, agent); users copy and edit them. A profile may instead replay a JSONL
file of recorded conversations: one JSON object per line, either ``{"messages": [...]}``
(the user turns are replayed in order; recorded assistant turns are replaced by the server's
answers) or ``{"turns": [{"user": "...", "max_tokens": 200}, ...]}``.
"""

from __future__ import annotations

import math
import random
import tomllib
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spoc_tui.core.errors import InputError
from spoc_tui.core.files import FileReadError, JsonLineError, json_lines, read_text_bounded
from spoc_tui.core.jsonsafe import finite_number

BUILTIN_DIR = Path(__file__).parent / "profiles"
DIST_KINDS = ("constant", "uniform", "lognormal", "normal")
_DIST_KEYS = {"dist", "value", "min", "max", "median", "sigma", "mean", "sd", "max_fraction_of_context"}
_PROFILE_KEYS = {
    "name",
    "description",
    "system_tokens",
    "turns",
    "first_user_tokens",
    "user_tokens",
    "output_tokens",
    "think_s",
    "mix",
    "replay",
    "ignore_eos",
}


class WorkloadError(InputError, ValueError):
    """A profile that cannot be used; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Dist:
    kind: str
    value: float = 0.0
    lo: float | None = None
    hi: float | None = None
    median: float = 0.0
    sigma: float = 0.0
    mean: float = 0.0
    sd: float = 0.0
    max_fraction_of_context: float | None = None
    most: float = math.inf
    """No draw is larger (:data:`MOST`: a lognormal's tail draws no ten-billion-token prompt)."""

    def sample(self, rng: random.Random, context_len: int | None = None) -> float:
        if self.kind == "constant":
            v = self.value
        elif self.kind == "uniform":
            v = rng.uniform(self.lo or 0.0, self.hi if self.hi is not None else 0.0)
        elif self.kind == "lognormal":
            v = rng.lognormvariate(math.log(self.median), self.sigma)
        else:
            v = rng.gauss(self.mean, self.sd)
        if self.lo is not None:
            v = max(self.lo, v)
        if self.hi is not None:
            v = min(self.hi, v)
        if self.max_fraction_of_context is not None and context_len:
            v = min(v, self.max_fraction_of_context * context_len)
        return max(0.0, min(v, self.most))

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dist": self.kind}
        needed = {"constant": ("value",), "uniform": (), "lognormal": ("median", "sigma"), "normal": ("mean", "sd")}[
            self.kind
        ]
        for k in needed:
            d[k] = getattr(self, k)
        if self.lo is not None:
            d["min"] = self.lo
        if self.hi is not None:
            d["max"] = self.hi
        if self.max_fraction_of_context is not None:
            d["max_fraction_of_context"] = self.max_fraction_of_context
        return d


MOST: dict[str, float] = {
    "turns": 10_000,
    "first_user_tokens": 10_000_000,
    "user_tokens": 10_000_000,
    "output_tokens": 10_000_000,
    "think_s": 86_400.0,
}
"""The largest value each distribution of a profile may name, and draw (a day of thinking, ten
million tokens): a typo of a few zeros is refused when the profile is read, not found as a user
that never finishes its first turn."""
MOST_SIGMA = 4.0
"""A lognormal's largest sigma (its 99th percentile is then 11,000 times its median)."""


def parse_dist(key: str, raw: object, file: str = "") -> Dist:
    """The distribution ``raw`` names for the profile's ``key`` (one of :data:`MOST`).

    Raises:
        WorkloadError: an unknown key or dist, a value that is not a finite number, or one out
            of its bounds (the message names ``file`` and ``key``).
    """
    most = MOST[key]
    where = f"{file}: {key}" if file else key
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = {"dist": "constant", "value": raw}
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: expected a number or a table with dist = ...")
    unknown = set(raw) - _DIST_KEYS
    if unknown:
        raise WorkloadError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_DIST_KEYS))})")
    kind = raw.get("dist", "constant")
    if kind not in DIST_KINDS:
        raise WorkloadError(f"{where}: unknown dist {kind!r} (known: {', '.join(DIST_KINDS)})")

    def num(k: str, default: float | None = None, positive: bool = False) -> float | None:
        v = raw.get(k, default)
        if v is None:
            return None
        if not finite_number(v):
            raise WorkloadError(f"{where}: {k} must be a number")
        if positive and v <= 0:
            raise WorkloadError(f"{where}: {k} must be positive")
        top = MOST_SIGMA if k == "sigma" else 1.0 if k == "max_fraction_of_context" else most
        if abs(v) > top:
            raise WorkloadError(f"{where}: {k} must be at most {top:,g}")
        return float(v)

    need = {
        "constant": ("value",),
        "uniform": ("min", "max"),
        "lognormal": ("median", "sigma"),
        "normal": ("mean", "sd"),
    }[kind]
    for k in need:
        if k not in raw:
            raise WorkloadError(f"{where}: dist {kind} needs {', '.join(need)}")
    d = Dist(
        kind,
        value=num("value", 0.0) or 0.0,
        lo=num("min"),
        hi=num("max"),
        median=num("median", 1.0, positive=kind == "lognormal") or 1.0,
        sigma=num("sigma", 0.0) or 0.0,
        mean=num("mean", 0.0) or 0.0,
        sd=num("sd", 0.0) or 0.0,
        max_fraction_of_context=num("max_fraction_of_context"),
        most=most,
    )
    if d.lo is not None and d.hi is not None and d.hi < d.lo:
        raise WorkloadError(f"{where}: max is below min")
    return d


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str = ""
    system_tokens: int = 0
    turns: Dist = Dist("constant", value=1)
    first_user_tokens: Dist | None = None
    user_tokens: Dist = Dist("constant", value=100)
    output_tokens: Dist = Dist("constant", value=200)
    think_s: Dist = Dist("constant", value=0)
    mix: tuple[tuple[Workload, float], ...] = ()
    replay: tuple[tuple[tuple[str, int | None], ...], ...] = ()
    """Recorded conversations: per conversation, (user text, max_tokens or None) per turn."""
    source: str = ""
    ignore_eos: bool = False
    """Ask vLLM to generate every planned output token (its ``ignore_eos`` extension, as
    ``vllm bench serve``'s random dataset does), so answer lengths are the profile's, not the
    model's: for benchmarks that compare clients like for like."""

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "description": self.description, "source": self.source}
        if self.mix:
            d["mix"] = [[p.as_dict(), w] for p, w in self.mix]
            return d
        if self.replay:
            d["replay"] = [[list(t) for t in conv] for conv in self.replay]
            d["output_tokens"] = self.output_tokens.as_dict()
            d["think_s"] = self.think_s.as_dict()
            return d
        d.update(
            system_tokens=self.system_tokens,
            turns=self.turns.as_dict(),
            first_user_tokens=self.first_user_tokens.as_dict() if self.first_user_tokens else None,
            user_tokens=self.user_tokens.as_dict(),
            output_tokens=self.output_tokens.as_dict(),
            think_s=self.think_s.as_dict(),
            ignore_eos=self.ignore_eos,
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        """Inverse of :meth:`as_dict` (how the runner child receives its profile)."""
        if d.get("mix"):
            return cls(
                d["name"],
                d.get("description", ""),
                mix=tuple((cls.from_dict(p), float(w)) for p, w in d["mix"]),
                source=d.get("source", ""),
            )
        if d.get("replay"):
            return cls(
                d["name"],
                d.get("description", ""),
                replay=tuple(tuple((str(u), m) for u, m in conv) for conv in d["replay"]),
                output_tokens=parse_dist("output_tokens", d["output_tokens"]),
                think_s=parse_dist("think_s", d["think_s"]),
                source=d.get("source", ""),
            )
        return cls(
            d["name"],
            d.get("description", ""),
            int(d.get("system_tokens", 0)),
            parse_dist("turns", d["turns"]),
            parse_dist("first_user_tokens", d["first_user_tokens"]) if d.get("first_user_tokens") else None,
            parse_dist("user_tokens", d["user_tokens"]),
            parse_dist("output_tokens", d["output_tokens"]),
            parse_dist("think_s", d["think_s"]),
            source=d.get("source", ""),
            ignore_eos=bool(d.get("ignore_eos", False)),
        )


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def load_workload(name_or_path: str, _depth: int = 0) -> Workload:
    """A built-in profile by name, or a TOML file.

    Raises:
        WorkloadError: unknown name (lists the built-ins), unreadable file, bad keys or values.
    """
    p = Path(name_or_path)
    if not p.suffix and not p.exists():
        p = BUILTIN_DIR / f"{name_or_path}.toml"
        if not p.exists():
            raise WorkloadError(
                f"unknown profile {name_or_path!r}; built-in: {', '.join(builtin_names())} (or a .toml file)"
            )
    try:
        data = tomllib.loads(read_text_bounded(p))
    except FileReadError as e:
        raise WorkloadError(f"{p}: {e}" if str(e) == "no such file" else f"{p}: cannot read ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise WorkloadError(f"{p}: invalid TOML ({e})") from None
    return _workload_from(data, p, _depth)


def _workload_from(data: dict[str, Any], p: Path, depth: int) -> Workload:
    where = p.name
    unknown = set(data) - _PROFILE_KEYS
    if unknown:
        raise WorkloadError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_PROFILE_KEYS))})")
    name = str(data.get("name") or p.stem)
    desc = str(data.get("description", ""))
    if "mix" in data:
        if depth > 2:
            raise WorkloadError(f"{where}: mixes nest too deep")
        mix = data["mix"]
        if not isinstance(mix, dict) or not mix:
            raise WorkloadError(f"{where}: mix must be a table of profile = share")
        parts = []
        for sub, w in mix.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or w <= 0:
                raise WorkloadError(f"{where}: mix share of {sub!r} must be a positive number")
            sub_path = (p.parent / f"{sub}.toml") if (p.parent / f"{sub}.toml").exists() else Path(sub)
            parts.append((load_workload(str(sub_path) if sub_path.exists() else sub, depth + 1), float(w)))
        total = sum(w for _, w in parts)
        return Workload(name, desc, mix=tuple((q, w / total) for q, w in parts), source=str(p))
    if "replay" in data:
        rp = Path(str(data["replay"]))
        if not rp.is_absolute():
            rp = p.parent / rp
        return Workload(
            name,
            desc,
            replay=load_replay(rp),
            output_tokens=parse_dist("output_tokens", data.get("output_tokens", 256), where),
            think_s=parse_dist("think_s", data.get("think_s", 0), where),
            source=str(p),
        )
    sys_tokens = data.get("system_tokens", 0)
    if isinstance(sys_tokens, bool) or not isinstance(sys_tokens, int) or not 0 <= sys_tokens <= MOST["user_tokens"]:
        raise WorkloadError(f"{where}: system_tokens must be a whole number from 0 to {MOST['user_tokens']:,g}")
    for required in ("user_tokens", "output_tokens"):
        if required not in data:
            raise WorkloadError(f"{where}: missing {required}")
    ignore_eos = data.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise WorkloadError(f"{where}: ignore_eos must be true or false")
    return Workload(
        name=name,
        description=desc,
        system_tokens=sys_tokens,
        turns=parse_dist("turns", data.get("turns", 1), where),
        first_user_tokens=parse_dist("first_user_tokens", data["first_user_tokens"], where)
        if "first_user_tokens" in data
        else None,
        user_tokens=parse_dist("user_tokens", data["user_tokens"], where),
        output_tokens=parse_dist("output_tokens", data["output_tokens"], where),
        think_s=parse_dist("think_s", data.get("think_s", 0), where),
        source=str(p),
        ignore_eos=ignore_eos,
    )


def load_replay(path: Path) -> tuple[tuple[tuple[str, int | None], ...], ...]:
    try:
        lines = read_text_bounded(path).splitlines()
    except FileReadError as e:
        raise WorkloadError(f"replay {path}: {e}") from None
    try:
        convs = [turns for i, obj in json_lines(lines) if (turns := _replay_turns(f"replay {path.name} line {i}", obj))]
    except JsonLineError as e:
        raise WorkloadError(f"replay {path.name} line {e.lineno}: not JSON ({e.msg})") from None
    if not convs:
        raise WorkloadError(f"replay {path.name}: no conversations")
    return tuple(convs)


def _replay_turns(where: str, obj: object) -> tuple[tuple[str, int | None], ...]:
    """One replay line's user turns, each with its max_tokens (None: the profile's)."""
    turns: list[tuple[str, int | None]] = []
    if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
        for m in obj["messages"]:
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                turns.append((m["content"], None))
    elif isinstance(obj, dict) and isinstance(obj.get("turns"), list):
        for t in obj["turns"]:
            if not isinstance(t, dict) or not isinstance(t.get("user"), str):
                raise WorkloadError(f"{where}: each turn needs a 'user' string")
            mt = t.get("max_tokens")
            turns.append((t["user"], int(mt) if isinstance(mt, int) and mt > 0 else None))
    else:
        raise WorkloadError(f'{where}: expected {{"messages": [...]}} or {{"turns": [...]}}')
    return tuple(turns)


# ---------------------------------------------------------------------------------------
# Conversation plans and synthetic text


@dataclass
class Turn:
    user_text: str
    max_tokens: int


@dataclass
class ConversationPlan:
    profile: str
    system_text: str
    turns: list[Turn] = field(default_factory=list)
    think_s: list[float] = field(default_factory=list)


WORDS = (
    "the service returns an error when the request queue grows past its limit and the cache "
    "holds recent blocks of tokens for each session while workers decode batches on the device "
    "config parser module function class method handler retry timeout latency throughput memory "
    "kernel scheduler buffer index query commit branch merge review test build deploy metric log "
    "trace warning failed started stopped connection socket thread process signal file path"
).split()


def load_tokenizer(path: str | Path) -> Any:
    """A Hugging Face ``tokenizer.json`` (or the folder holding one), as a ``tokenizers.Tokenizer``.

    Raises:
        WorkloadError: no such file, not a regular file, larger than 64 MiB, or not a tokenizer
            (the library's own words).
    """
    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    try:
        return Tokenizer.from_str(read_text_bounded(p))
    except FileReadError as e:
        raise WorkloadError(f"--tokenizer {p}: {e}") from None
    except Exception as e:  # the library raises a bare Exception for a file it cannot read
        raise WorkloadError(f"--tokenizer {p}: not a tokenizer.json ({e})") from None


class TextMaker:
    """Synthetic text of a given token length.

    With the server's tokenizer (a local ``tokenizer.json``, or the server's own ``/tokenize``
    through :meth:`learn`), lengths are exact. Otherwise the words-per-token ratio starts at 1.0
    and is calibrated from the server's reported ``usage.prompt_tokens``.

    The tokenizer runs once per vocabulary word, when the maker is built (before any request is
    timed): where it splits text at spaces (byte-level BPE, SentencePiece-style Metaspace), a word
    sequence's token count is the sum of its words' counts, so text of an exact length is then
    built from those counts with no tokenizer call on the load generator's event loop (issue 15:
    tokenizing there stalled other users' streams, TTFT p99 2.7x). A tokenizer for which sums are
    not exact (checked at build) keeps the slower encode-and-cut path.
    """

    def __init__(self, tokenizer_path: str | None = None) -> None:
        self.tokenizer: Any = None
        self.tokens_per_word = 1.0
        self.additive = False
        self._first: list[int] = []  # tokens of WORDS[i] at the start of a text
        self._after: list[int] = []  # tokens of " " + WORDS[i] after another word
        self._ones: list[int] = []  # indices of words that are one token after a space
        if tokenizer_path:
            self.tokenizer = load_tokenizer(tokenizer_path)
            self.learn(self._count)

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def learn(self, count: Callable[[str], int]) -> bool:
        """Learn every vocabulary word's token count with ``count`` (text -> tokens, without
        special tokens: a local tokenizer, or a server's ``/tokenize``) and turn exact lengths on
        when the counts add up (checked on five random texts). Returns whether they do; exceptions
        from ``count`` propagate, leaving the maker as it was."""
        first = [count(w) for w in WORDS]
        x = count("x")
        after = [count("x " + w) - x for w in WORDS]
        ones = [i for i, c in enumerate(after) if c == 1]
        if not ones or min(first) < 1 or min(after) < 1:
            return False
        rng = random.Random(12345)
        for n in (1, 2, 7, 60, 400):  # the sums must be exact, or the fast path stays off
            idx = [rng.randrange(len(WORDS)) for _ in range(n)]
            text = " ".join(WORDS[i] for i in idx)
            if count(text) != first[idx[0]] + sum(after[i] for i in idx[1:]):
                return False
        self._first, self._after, self._ones = first, after, ones
        self.additive = True
        return True

    def text(self, tokens: int, rng: random.Random) -> str:
        tokens = max(1, int(tokens))
        if self.additive:
            return self._text_from_counts(tokens, rng)
        if self.tokenizer is None:
            n = max(1, round(tokens / self.tokens_per_word))
            return " ".join(rng.choice(WORDS) for _ in range(n))
        return self._text_by_encoding(tokens, rng)

    def _text_from_counts(self, tokens: int, rng: random.Random) -> str:
        nw = len(WORDS)
        i = rng.randrange(nw)
        for _ in range(8):  # a first word that fits (a one-token first word exists in practice)
            if self._first[i] <= tokens:
                break
            i = rng.randrange(nw)
        else:
            if self.tokenizer is None:  # counts from a server: the shortest first word
                i = min(range(nw), key=self._first.__getitem__)
            else:
                return self._text_by_encoding(tokens, rng)
        return self._append_words([WORDS[i]], tokens - self._first[i], rng)

    def _append_words(self, words: list[str], left: int, rng: random.Random) -> str:
        """``words`` and then words whose counts after a space add up to ``left`` tokens exactly
        (the fast path: a one-token word where a drawn one would overshoot), joined."""
        nw = len(WORDS)
        while left > 0:
            j = rng.randrange(nw)
            if self._after[j] > left:
                j = rng.choice(self._ones)
            words.append(WORDS[j])
            left -= self._after[j]
        return " ".join(words)

    def continuation(self, tokens: int, rng: random.Random) -> str:
        """Text of exactly ``tokens`` tokens where it follows a space (after other text); only with
        additive counts (:attr:`additive`)."""
        return self._append_words([], tokens, rng)

    def _text_by_encoding(self, tokens: int, rng: random.Random) -> str:
        words: list[str] = []
        while True:
            words.extend(rng.choice(WORDS) for _ in range(max(1, tokens - len(words) // 2)))
            ids = self.tokenizer.encode(" ".join(words), add_special_tokens=False).ids
            if len(ids) >= tokens + 8:
                break
        # Cut to the token count; a cut can re-tokenize differently, so adjust until exact.
        k = tokens
        best = ""
        for _ in range(8):
            text = self.tokenizer.decode(ids[:k])
            count = len(self.tokenizer.encode(text, add_special_tokens=False).ids)
            best = text
            if count == tokens:
                break
            k = max(1, min(len(ids), k + tokens - count))
        return best

    @property
    def exact(self) -> bool:
        """Lengths are exact (a tokenizer, local or learned): nothing to calibrate."""
        return self.additive or self.tokenizer is not None

    def calibrate(self, words_sent: int, reported_tokens: int, overhead: int = 0) -> None:
        """Move the tokens-per-word estimate towards what the server counted for the words sent
        (``overhead``: the chat template's tokens)."""
        if self.exact or words_sent <= 0 or reported_tokens <= overhead:
            return
        observed = (reported_tokens - overhead) / words_sent
        if 0.2 < observed < 10:
            self.tokens_per_word = 0.7 * self.tokens_per_word + 0.3 * observed


class TracePrompts:
    """Prompt text for trace rows: each row's input tokens exact (where the maker's lengths are),
    rows that share leading hash ids share identical leading text of that many blocks, and the
    rest of a row is text of its own.

    A block's text is drawn from a generator seeded by (salt, scope, hash id), so the same id
    gives the same words wherever it appears; a new ``salt`` (one per replay step) gives new
    words, so one step's prompts do not hit the prefix cache another step left. Blocks are
    joined by spaces: where the tokenizer splits at spaces (the maker's fast path), a block's
    tokens after a space are its words' counts, and blocks do not merge across the boundary.
    """

    CACHE = 4096
    """Blocks' texts kept (recently used first): a block shared by many rows is drawn once."""

    def __init__(self, maker: TextMaker, salt: str) -> None:
        self.maker = maker
        self.salt = salt
        self._blocks: OrderedDict[tuple[str | None, int, int, bool], str] = OrderedDict()

    def prompt(
        self, index: int, tokens: int, hash_ids: Sequence[int] = (), block_tokens: int = 0, scope: str | None = None
    ) -> str:
        parts: list[str] = []
        left = tokens
        for h in hash_ids:
            n = min(block_tokens, left)
            if n <= 0:
                break
            parts.append(self._block(scope, h, n, not parts))
            left -= n
        if left > 0:
            parts.append(self._words(random.Random(f"{self.salt}:row:{index}"), left, not parts))
        return " ".join(parts)

    def _block(self, scope: str | None, h: int, tokens: int, at_start: bool) -> str:
        key = (scope, h, tokens, at_start)
        text = self._blocks.get(key)
        if text is not None:
            self._blocks.move_to_end(key)
            return text
        text = self._words(random.Random(f"{self.salt}:{scope}:{h}"), tokens, at_start)
        self._blocks[key] = text
        if len(self._blocks) > self.CACHE:
            self._blocks.popitem(last=False)
        return text

    def _words(self, rng: random.Random, tokens: int, at_start: bool) -> str:
        m = self.maker
        if at_start or not m.additive:
            return m.text(tokens, rng)
        return m.continuation(tokens, rng)


def plan_conversation(
    profile: Workload, rng: random.Random, maker: TextMaker, context_len: int | None, system_cache: dict[str, str]
) -> ConversationPlan:
    """Draw one conversation from a profile (mixes pick a member by share)."""
    if profile.mix:
        x = rng.random()
        acc = 0.0
        for sub, w in profile.mix:
            acc += w
            if x <= acc:
                return plan_conversation(sub, rng, maker, context_len, system_cache)
        return plan_conversation(profile.mix[-1][0], rng, maker, context_len, system_cache)
    if profile.replay:
        conv = rng.choice(profile.replay)
        turns = [Turn(u, m or int(profile.output_tokens.sample(rng)) or 1) for u, m in conv]
        return ConversationPlan(profile.name, "", turns, [profile.think_s.sample(rng) for _ in turns])
    key = f"{profile.name}:{profile.system_tokens}"
    if key not in system_cache:  # one shared system prompt per profile: real prefix hits
        system_cache[key] = (
            maker.text(profile.system_tokens, random.Random(zlib.crc32(key.encode()))) if profile.system_tokens else ""
        )
    n = max(1, round(profile.turns.sample(rng)))
    turns = []
    for i in range(n):
        dist = profile.first_user_tokens if i == 0 and profile.first_user_tokens else profile.user_tokens
        tokens = max(1, round(dist.sample(rng, context_len)))
        out = max(1, round(profile.output_tokens.sample(rng, context_len)))
        turns.append(Turn(maker.text(tokens, rng), out))
    return ConversationPlan(profile.name, system_cache[key], turns, [profile.think_s.sample(rng) for _ in range(n)])


START_JITTER_S = 1.0
"""De-synchronized arrivals (the default): a new user waits up to this long before its first turn."""


def jitter(rng: random.Random, last_s: float | None, lockstep: bool = False) -> float:
    """Seconds a user waits before a turn: before its first (``last_s`` None), a random part of
    :data:`START_JITTER_S`, so that users do not start in lockstep (none with ``--arrivals
    lockstep``); before a later one, none: the profile's think time paces the turns, and without
    one a user sends as its answer ends, as ``vllm bench serve``'s streams do.

    A random wait of up to a tenth of the last request (at most 0.25 s) before each later turn
    was meant to keep users whose answers end in the same engine step apart. Measured, it brought
    them together instead (docs/ramps.md), and it held back 5-7 % of the load a step of N users
    offers: on the real vLLM CPU server at 12 users, 42-45 ms before each send, and 0.94 of the
    tokens a second ``vllm bench serve`` drew with 12 streams (issue 77)."""
    if lockstep or last_s is not None:
        return 0.0
    return rng.uniform(0.0, START_JITTER_S)
