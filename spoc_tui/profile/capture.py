"""Profiling a running vLLM server: POST /start_profile, drive a short load (or take the
traffic there is), POST /stop_profile, and find the trace the server wrote.

The server must run with the torch profiler configured (vLLM 0.32:
``--profiler-config '{"profiler": "torch", "torch_profiler_dir": "DIR"}'``; older versions:
``VLLM_TORCH_PROFILER_DIR=DIR``); without it the two endpoints do not exist (404). ``DIR`` is a
folder on the server's host, so reading the trace needs that folder here too (same host, or a
shared mount). The profiler is stopped whatever happens once it started (an error, Ctrl-C), so a
server is never left recording.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from spoc_tui.core.errors import SpocError
from spoc_tui.core.ramp.knee import FixedUsers
from spoc_tui.core.redact import redact_text
from spoc_tui.load.ramp import RampConfig, RampError, RampProgress, run_ramp
from spoc_tui.workload import Workload

TRACE_GLOBS = ("*.pt.trace.json.gz", "*.pt.trace.json")


class ProfileError(SpocError):
    """The server refused or failed to profile (exit code 1)."""


def profiler_config(trace_dir: Path | str) -> dict[str, object]:
    """vLLM's ``--profiler-config`` for a profile spoc reads: the engine's trace only (the API
    process's trace holds no model work) and no Python stacks (spoc reads kernel names and
    steps). On the CPU engine that halves the trace and the profiler's overhead, and the server
    writes it far sooner (a 5 s profile at 16 users of the tiny test model: 46 MB of traces and
    about 2.5 minutes of writing with vLLM's defaults)."""
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir),
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,
    }


def profiler_flag(trace_dir: Path | str) -> str:
    return f"--profiler-config '{json.dumps(profiler_config(trace_dir))}'"


@dataclass
class CaptureConfig:
    url: str
    """The server's base URL."""
    trace_dir: Path
    seconds: float = 10.0
    users: int = 0
    """Users of the load driven while profiling (0: profile the traffic there is)."""
    profile: Workload | None = None
    model: str | None = None
    warmup_s: float = 5.0
    api_key: str | None = field(default=None, repr=False)
    trace_wait_s: float = 300.0
    seed: int = 0


def traces_in(folder: Path) -> dict[Path, float]:
    """Trace files under ``folder`` (vLLM writes them there or in a subfolder) -> mtime."""
    found: dict[Path, float] = {}
    if not folder.is_dir():
        return found
    for pattern in TRACE_GLOBS:
        for p in folder.rglob(pattern):
            with contextlib.suppress(OSError):
                found[p] = p.stat().st_mtime
    return found


async def _post(client: httpx.AsyncClient, url: str, path: str, trace_dir: Path, timeout: float) -> None:
    try:
        r = await client.post(url + path, timeout=timeout)
    except httpx.HTTPError as e:
        raise ProfileError(f"POST {path}: {redact_text(str(e)) or type(e).__name__}") from None
    if r.status_code == 404:
        raise ProfileError(
            f"the server has no {path} (404): it was started without the profiler. Start vLLM with "
            f"{profiler_flag(trace_dir)} (vLLM before 0.1x: VLLM_TORCH_PROFILER_DIR={trace_dir})"
        )
    if r.status_code in (401, 403):
        raise ProfileError(f"POST {path}: {r.status_code}: the server wants an API key (--api-key-file)")
    if r.status_code != 200:
        raise ProfileError(f"POST {path}: HTTP {r.status_code}: {redact_text(r.text[:200])}")


def pick_trace(sizes: dict[Path, int]) -> Path:
    ranks = sorted((p for p in sizes if p.name.startswith("rank")), key=lambda p: (len(p.name), p.name))
    if ranks:
        return ranks[0]
    workers = [p for p in sizes if "async_llm" not in p.name] or list(sizes)
    return max(workers, key=lambda p: sizes[p])


async def wait_for_trace(
    trace_dir: Path, before: dict[Path, float], timeout_s: float, on_wait: Callable[[float], None] | None = None
) -> Path:
    """The engine's trace written since ``before``, once every new trace stopped growing.

    vLLM writes one trace per worker (``rank0…``, ``rank1…``) and one for the API process
    (``…async_llm…``, no model work): the lowest rank's is taken, else the largest."""
    t0 = time.monotonic()
    last: dict[Path, int] | None = None
    while True:
        now = traces_in(trace_dir)
        new = [p for p, m in now.items() if p not in before or m > before[p]]
        if new:
            sizes: dict[Path, int] = {}
            for p in new:
                with contextlib.suppress(OSError):
                    sizes[p] = p.stat().st_size
            api_only = all("async_llm" in p.name for p in sizes)
            if sizes and sizes == last and all(sizes.values()) and not (api_only and time.monotonic() - t0 < 20):
                return pick_trace(sizes)
            last = sizes
        waited = time.monotonic() - t0
        if waited > timeout_s:
            raise ProfileError(
                f"no new trace in {trace_dir} after {timeout_s:.0f} s: is that the server's torch_profiler_dir, "
                "and is it on this host (or a shared mount)?"
            )
        if on_wait:
            on_wait(waited)
        await asyncio.sleep(1.0)


async def capture(
    cfg: CaptureConfig,
    say: Callable[[str], None] = lambda _: None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Path:
    """Profile ``cfg.seconds`` of the server's work and return the trace file it wrote.

    ``transport``: where the profiler's requests go (None: the network; tests: in memory)."""
    base = cfg.url.rstrip("/")
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    before = traces_in(cfg.trace_dir)
    ramp_task: asyncio.Task[object] | None = None
    work: Path | None = None
    measuring = asyncio.Event()
    async with httpx.AsyncClient(headers=headers, transport=transport) as client:
        try:
            if cfg.users > 0:
                if cfg.profile is None:
                    raise ProfileError("a load profile is needed with --users")
                work = Path(tempfile.mkdtemp(prefix="spoc-profile-"))

                def progress(p: RampProgress) -> None:
                    if p.phase == "measuring":
                        measuring.set()
                    elif p.phase == "warmup":
                        say(f"load: {cfg.users} users ({cfg.profile.name if cfg.profile else ''}), warming up")

                ramp = RampConfig(
                    url=base,
                    workload=cfg.profile,
                    plan=FixedUsers([cfg.users]),
                    limits=(),
                    out_dir=work,
                    model=cfg.model,
                    step_s=cfg.warmup_s + cfg.seconds + 600.0,
                    max_step_s=cfg.warmup_s + cfg.seconds + 600.0,
                    warmup_s=cfg.warmup_s,
                    seed=cfg.seed,
                    api_key=cfg.api_key,
                )
                ramp_task = asyncio.ensure_future(run_ramp(ramp, progress))
                waiter = asyncio.ensure_future(measuring.wait())
                done, _ = await asyncio.wait({ramp_task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if ramp_task in done:
                    waiter.cancel()
                    try:
                        ramp_task.result()
                    except RampError as e:
                        raise ProfileError(f"the load could not start: {e}") from None
                    raise ProfileError("the load ended before it was measured")
            say("starting the profiler (POST /start_profile)")
            await _post(client, base, "/start_profile", cfg.trace_dir, 120.0)
            try:
                t0 = time.monotonic()
                while (left := cfg.seconds - (time.monotonic() - t0)) > 0:
                    if ramp_task is not None and ramp_task.done():
                        ramp_task.result()
                        raise ProfileError("the load generator stopped while profiling")
                    await asyncio.sleep(min(1.0, left))
                    say(f"profiling: {min(cfg.seconds, time.monotonic() - t0):.0f}/{cfg.seconds:g} s")
            finally:
                say("stopping the profiler (POST /stop_profile); the server writes the trace now")
                await asyncio.shield(_post(client, base, "/stop_profile", cfg.trace_dir, 900.0))
        finally:
            if ramp_task is not None and not ramp_task.done():
                ramp_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RampError, Exception):
                    await ramp_task
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
    return await wait_for_trace(
        cfg.trace_dir, before, cfg.trace_wait_s, lambda w: say(f"waiting for the trace file ({w:.0f} s)")
    )
