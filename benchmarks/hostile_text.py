"""The redactor and the terminal escaper on hostile text, beside the redactor's old pattern, in one run.

Target (issue 56, item 4): ``redact_text`` on 1 MB of any character in under 0.1 s (linear time);
``for_terminal`` (redacted, escaped and clipped, as every CLI error line is printed) likewise. The
old URL-userinfo pattern (``[a-zA-Z][a-zA-Z0-9+.-]*://[^/\\s@]+@``) backtracked from every
position: it is timed beside the new on the same text at sizes it can finish (10k and 30k letters;
23 s at 100k), so the ratio is from one run on one host.

``--smoke`` (make test): 100 KB bodies, the old pattern at 3k letters.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spoc_tui.core.redact import redact_text  # noqa: E402
from spoc_tui.core.textsafe import for_terminal  # noqa: E402

SMOKE = "--smoke" in sys.argv
SIZE = 100_000 if SMOKE else 1_000_000
OLD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
UNITS = [
    "a",
    "a.",
    "://",
    "a://",
    "x://u@",
    "a1://u@",
    "http://a",
    "bearer ",
    "Bearer x ",
    "sk-abcdefgh ",
    "@",
    " ",
    "\x1b",
    "\u202e",
    "é",
    "\n",
]


def timed(fn: object, text: str) -> float:
    t0 = time.perf_counter()
    fn(text)  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> int:
    worst = {"redact_text": 0.0, "for_terminal": 0.0}
    print(f"{'unit':>14} {'redact_text s':>14} {'for_terminal s':>15}   ({SIZE:,} characters each)")
    for unit in UNITS:
        text = (unit * (SIZE // len(unit) + 1))[:SIZE]
        r = timed(redact_text, text)
        f = timed(for_terminal, text)
        worst["redact_text"] = max(worst["redact_text"], r)
        worst["for_terminal"] = max(worst["for_terminal"], f)
        print(f"{unit!r:>14} {r:14.4f} {f:15.4f}")
    print("beside the old pattern (letters alone, the worst case for it):")
    for n in (3_000,) if SMOKE else (10_000, 30_000):
        text = "a" * n
        old = timed(lambda t: OLD.sub("***@", t), text)
        new = timed(redact_text, text)
        print(f"  {n:>7,} letters: old {old:.4f} s, new {new:.5f} s, ratio = old/new {old / max(new, 1e-9):,.0f}x")
    for name, s in worst.items():
        per_mb = s * 1_000_000 / SIZE
        verdict = "meets" if per_mb < 0.1 else "MISSES"
        print(f"{name}: worst {s:.4f} s on {SIZE:,} characters ({per_mb:.3f} s per MB): {verdict} the 0.1 s/MB target")
    return 0


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    sys.exit(main())
