"""Build and run a simulator from command-line style options (``spoc sim``)."""

from __future__ import annotations

import asyncio
import errno
import math
import signal
import sys
from collections.abc import Callable
from dataclasses import fields, replace

from spoc_tui.core.hardware.capacity import CapacityError
from spoc_tui.core.hardware.presets import PresetError, gpu_preset, model_preset
from spoc_tui.core.textsafe import clip, safe
from spoc_tui.core.tuning.engineflags import EngineFlags
from spoc_tui.procs.ports import port_holder
from spoc_tui.sim.engine import EngineConfig, SimEngine
from spoc_tui.sim.gpu import SimGpu
from spoc_tui.sim.load import BuiltinLoad, run_until
from spoc_tui.sim.options import MULTI_REPLICA, SCENARIOS, SimConfigError, SimOptions
from spoc_tui.sim.server import SimServer

HOT_GPU_RESISTANCE = 0.115
"""C/W of the weakly cooled GPU in the thermal scenario (others: 0.060)."""
SLOW_REPLICA_GPU = "l40s"
"""The lagging replica's GPUs in the imbalanced scenario: an older, slower board behind the same
round-robin balancer (a quarter of an H100's memory bandwidth), as mixed fleets have."""
MAX_REPLICAS = 16


def replica_count(opts: SimOptions) -> int:
    if opts.replicas is None:
        return 3 if opts.scenario in MULTI_REPLICA else 1
    return opts.replicas


EngineFactory = Callable[[SimOptions], SimEngine]
"""Another engine for ``spoc sim`` to serve (``--twin``: the twin's, composed by the CLI; the
simulator knows no twin)."""


def build_replicas(opts: SimOptions, factory: EngineFactory | None = None) -> list[tuple[SimEngine, int]]:
    """One (engine, background users) per replica; the imbalanced scenario's last replica runs
    on hot, power-capped GPUs. The background users are split evenly, as a round-robin balancer
    would send them.

    Raises:
        SimConfigError: as :func:`build`, and a replica count out of range.
    """
    n = replica_count(opts)
    if not 1 <= n <= MAX_REPLICAS:
        raise SimConfigError(f"--replicas must be between 1 and {MAX_REPLICAS}, got {n}")
    if opts.scenario in MULTI_REPLICA and n < 2:
        raise SimConfigError(f"the {opts.scenario} scenario needs 2 replicas or more (--replicas)")
    out: list[tuple[SimEngine, int]] = []
    for i in range(n):
        slow = opts.scenario in MULTI_REPLICA and i == n - 1
        built, users = build(replace(opts, seed=opts.seed + i, gpu=SLOW_REPLICA_GPU if slow else opts.gpu), factory)
        share = users // n + (1 if i < users % n else 0)
        out.append((built, share))
    return out


def build(opts: SimOptions, factory: EngineFactory | None = None) -> tuple[SimEngine, int]:
    """Engine and background-load size for the options (``factory``: a ``--twin``'s engine).

    Raises:
        SimConfigError: unknown presets, impossible configurations, ``--twin`` with no factory.
    """
    if opts.twin is not None:
        if factory is None:
            raise SimConfigError("--twin: this simulator was given no twin to serve")
        return factory(opts), opts.load_users or 0
    if opts.scenario not in SCENARIOS:
        raise SimConfigError(f"unknown scenario {opts.scenario!r}; known: {', '.join(SCENARIOS)}")
    try:
        model = model_preset(opts.model)
        gpu = gpu_preset(opts.gpu)
    except PresetError as e:
        raise SimConfigError(str(e)) from None
    tp = opts.tp if opts.tp is not None else (4 if opts.scenario == "thermal" else 1)
    if tp < 1:
        raise SimConfigError("--tp must be at least 1")
    if opts.scenario == "thermal" and tp < 2:
        raise SimConfigError("the thermal scenario needs a TP group: use --tp 2 or more")
    if model.num_heads % tp:
        raise SimConfigError(f"TP {tp} does not divide the model's {model.num_heads} attention heads")
    if not 0 < opts.speed < math.inf:
        raise SimConfigError("--speed must be a positive number")
    for flag, port in (("--port", opts.port), ("--dcgm-port", opts.dcgm_port)):
        if port is not None and not 0 <= port <= 65535:
            raise SimConfigError(f"{flag} must be between 0 and 65535, got {port}")
    if opts.load_users is not None and opts.load_users < 0:
        raise SimConfigError("--load-users must be 0 or more")
    cfg = EngineConfig(
        model=model,
        gpu=gpu,
        served_model_name=opts.served_model_name or model.served_name,
        tp=tp,
        **{f.name: getattr(opts, f.name) for f in fields(EngineFlags)},
        quantization=opts.quantization,
        speed=opts.speed,
        seed=opts.seed,
    )
    gpus = [SimGpu(i, gpu, seed=opts.seed) for i in range(tp)]
    if opts.scenario == "thermal":
        hot = gpus[-1]
        hot.thermal_resistance = HOT_GPU_RESISTANCE
        # already at its slowdown temperature: it throttles from the first busy second, so the thermal
        # verdict shows at once (from 82 C it read healthy for the first 20-30 s of the demo)
        hot.temp_c = gpu.slowdown_temp_c
    try:
        engine = SimEngine(cfg, gpus)
    except CapacityError as e:
        raise SimConfigError(str(e)) from None
    return engine, opts.load_users or 0


def demo_users(scenario: str, engine: SimEngine) -> int:
    """Background users for ``spoc demo``: comfortable, or far past capacity for overload."""
    if scenario == "overload":
        return max(64, engine.cfg.max_num_seqs * 3)
    if scenario in MULTI_REPLICA:
        return 96  # 32 a replica
    return 48


async def serve(
    opts: SimOptions, ready: asyncio.Event | None = None, announce: bool = True, factory: EngineFactory | None = None
) -> None:
    replicas = build_replicas(opts, factory)
    n = len(replicas)
    servers: list[SimServer] = []
    loads: list[BuiltinLoad] = []
    stop = asyncio.Event()
    for i, (engine, users) in enumerate(replicas):
        port = opts.port + i if opts.port else 0
        dport = None if opts.dcgm_port is None or opts.twin else (opts.dcgm_port + i if opts.dcgm_port else 0)
        server = SimServer(
            engine,
            host=opts.host,
            port=port,
            dcgm_port=dport,
            hostname="spoc-sim" if n == 1 else f"spoc-sim-{i}",
            truth_log=opts.truth_log if n == 1 else None,
            api_key=opts.api_key,
            stop_event=stop,
        )
        servers.append(server)
        try:
            await server.start()
        except OSError as e:
            for s in servers:
                await s.close()
            if e.errno in (errno.EADDRINUSE, 98):
                held = [f"{p} by {h}" for p in (port, dport) if p and (h := port_holder(p))]
                which = "; ".join(held) if held else f"{port} or {dport}"
                raise SimConfigError(f"port already in use on {opts.host} ({which})") from None
            raise SimConfigError(f"cannot listen on {opts.host}: {e.strerror or e}") from None
        if users:
            overload = opts.scenario == "overload"
            loads.append(
                BuiltinLoad(
                    engine, users, server.wake, seed=opts.seed + i, heavy=overload, ramp_s=90.0 if overload else None
                )
            )
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests): Ctrl-C still raises
            pass
    if announce:
        for i, ((engine, users), server) in enumerate(zip(replicas, servers)):
            cfg = engine.cfg
            lags = opts.scenario in MULTI_REPLICA and i == n - 1
            slow = f" (slower {cfg.gpu.label} GPUs: the lagging replica)" if lags else ""
            kv = f"{engine.num_blocks} blocks x {cfg.block_size} tokens = {engine.plan.kv_cache_tokens} tokens"
            what = f"the twin in {opts.twin}" if opts.twin else f"{cfg.tp}x {cfg.gpu.label} ({opts.scenario})"
            print(
                f"spoc sim: SIMULATED {safe(clip(cfg.served_model_name, 200))} on {safe(clip(what, 300))}"
                + (f", replica {i}{slow}" if n > 1 else "")
                + f"\n  OpenAI API + vLLM metrics: http://{opts.host}:{server.bound_port}\n"
                + (
                    f"  DCGM metrics:              http://{opts.host}:{server.bound_dcgm_port}/metrics\n"
                    if server.bound_dcgm_port
                    else ""
                )
                + f"  KV cache: {kv}"
                + (f"; background load: {users} users" if users else ""),
                flush=True,
            )
    if ready is not None:
        ready.set()
    try:
        await run_until(stop, [load.run(stop) for load in loads])
    finally:
        # stopping: a second stop signal (the process group's, then the guard's, forwarded) is
        # ignored, not handled by a loop about to close its wakeup pipe: Python then printed
        # "Exception ignored when trying to write to the signal wakeup fd" with a traceback into
        # the server's log (the Tune screen's server-log pane) after a trial's server stopped
        for sig in handled:
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)
        for s in servers:
            await s.close()


def main(opts: SimOptions, factory: EngineFactory | None = None) -> int:
    try:
        asyncio.run(serve(opts, factory=factory))
    except SimConfigError as e:
        print(f"spoc sim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C is how a foreground simulator is meant to stop
        pass
    return 0
