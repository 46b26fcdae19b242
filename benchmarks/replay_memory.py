"""Traffic traces as a stream: a 1 GB Mooncake trace read, described and scheduled in bounded memory.

Target (issue 33): a 1 GB trace replays in under 300 MB RSS. A replay holds three passes over
the file, each measured here in a child process of its own (its peak RSS is the child's alone):

1. ``spoc trace stats FILE --json``: the command as a user runs it (lengths kept as compact
   arrays, the prefix share from at most a million hash blocks);
2. the ramp's read-through before any load (``scan_trace``: every row checked, the span);
3. a load-generator process's replay share (``ReplayShare``: the rows in time order, its
   conversations, skips and prefix accounting) with the prompt of every 100th row built by
   ``TracePrompts`` (its block cache included). The HTTP sends are not made: a 1 GB trace is
   four million requests, days of load; what is measured is everything the replay holds per
   row, and the requests in flight are bounded by the server, not the trace.

For scale, reading the same file with a plain ``[json.loads(line) for line in f]`` is measured
beside on a 50 MB slice. The trace is synthetic (Mooncake's published shape: arrivals over an
hour, input lengths around 12k tokens in 512-token blocks, a third of rows sharing a prefix).
Run with ``make bench`` (or ``python benchmarks/replay_memory.py [MB]``); ``--smoke`` runs on 5 MB.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_MB = 300.0


def write_trace(path: Path, megabytes: float) -> int:
    rng = random.Random(7)
    limit = megabytes * 1024 * 1024
    t = 0.0
    n = 0
    written = 0
    shared = [rng.randrange(1 << 40) for _ in range(64)]
    with path.open("w") as f:
        while written < limit:
            t += rng.expovariate(3.3) * 1000
            n_in = max(1, int(rng.lognormvariate(9.1, 0.8)))
            blocks = -(-n_in // 512)
            if rng.random() < 0.33:
                head = shared[: min(blocks, rng.randrange(1, 24))]
                ids = head + [rng.randrange(1 << 40) for _ in range(blocks - len(head))]
            else:
                ids = [rng.randrange(1 << 40) for _ in range(blocks)]
            line = json.dumps(
                {"timestamp": int(t), "input_length": n_in, "output_length": rng.randint(20, 600), "hash_ids": ids}
            )
            f.write(line + "\n")
            written += len(line) + 1
            n += 1
    return n


CHILD = r"""
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
what, path = sys.argv[1], Path(sys.argv[2])
out = {}
if what == "stats":
    from click.testing import CliRunner  # the command itself, in this process
    from spoc_tui.cli.main import cli
    r = CliRunner().invoke(cli, ["trace", "stats", str(path), "--json"])
    assert r.exit_code == 0, r.output
    out["rows"] = json.loads(r.output)["rows"]
elif what == "scan":
    from spoc_tui.core.traces.read import trace_source
    from spoc_tui.load.ramp import scan_trace
    out["rows"] = scan_trace(trace_source(str(path))).rows
elif what == "share":
    import random
    from spoc_tui.core.traces.replay import ReplayShare
    from spoc_tui.core.traces.read import trace_source
    from spoc_tui.workload import TextMaker, TracePrompts
    share = ReplayShare(trace_source(str(path)), (0, 1), 131072)
    prompts = TracePrompts(TextMaker(), "bench")
    chars = 0
    for i, row in enumerate(share):
        if i % 100 == 0:
            chars += len(prompts.prompt(row.index, row.input_tokens, row.hash_ids, row.block_tokens, row.scope))
    out["rows"] = share.rows
    out["prefix_share"] = round(share.prefix_tokens / max(1, share.prefix_input), 3)
elif what == "naive":
    with path.open() as f:
        rows = [json.loads(line) for line in f]
    out["rows"] = len(rows)
out["seconds"] = round(time.perf_counter() - t0, 1)
out["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
print(json.dumps(out))
"""


def measure(what: str, path: Path) -> dict[str, float]:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, what, str(path)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    if r.returncode != 0:
        raise SystemExit(f"{what}: failed\n{r.stdout}{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    smoke = "--smoke" in sys.argv
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    mb = 5.0 if smoke else float(args[0]) if args else 1024.0
    with tempfile.TemporaryDirectory(prefix="spoc-replay-mem-") as tmp:
        path = Path(tmp) / "mooncake.jsonl"
        t0 = time.perf_counter()
        rows = write_trace(path, mb)
        size = path.stat().st_size / 1024 / 1024
        print(f"trace: {size:,.0f} MB, {rows:,} Mooncake rows (written in {time.perf_counter() - t0:.0f} s)")
        worst = 0.0
        for what, label in (
            ("stats", "spoc trace stats --json"),
            ("scan", "the ramp's read-through (scan_trace)"),
            ("share", "a load generator's replay share (ReplayShare + prompts)"),
        ):
            m = measure(what, path)
            worst = max(worst, m["rss_mb"])
            extra = f", implied prefix share {m['prefix_share']:.0%}" if "prefix_share" in m else ""
            print(f"  {label:<58} peak RSS {m['rss_mb']:7.1f} MB  {m['seconds']:6.1f} s{extra}")
            assert m["rows"] == rows, (what, m["rows"], rows)
        slice_mb = min(50.0, size)
        part = Path(tmp) / "slice.jsonl"
        with path.open() as src, part.open("w") as dst:
            left = slice_mb * 1024 * 1024
            for line in src:
                if left <= 0:
                    break
                dst.write(line)
                left -= len(line)
        naive = measure("naive", part)
        ours = measure("scan", part)
        print(
            f"  beside, on a {slice_mb:.0f} MB slice: json.loads of every line {naive['rss_mb']:.0f} MB, "
            f"ours {ours['rss_mb']:.0f} MB"
        )
        verdict = "meets" if worst <= TARGET_MB else "MISSES"
        print(f"peak RSS {worst:.0f} MB for a {size:,.0f} MB trace: {verdict} the {TARGET_MB:.0f} MB target")
        return 0 if worst <= TARGET_MB or smoke else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    sys.exit(main())
