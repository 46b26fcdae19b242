"""``spoc demo``: the simulator with a background load, and the monitor on it. Light to import:
a refused option answers before the app and the simulator's process code load."""

from __future__ import annotations

import sys

import click

from spoc_tui.cli.options import default_option
from spoc_tui.config import Settings
from spoc_tui.core.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE
from spoc_tui.core.hardware.presets import GPUS
from spoc_tui.procs.ports import free_block, free_ports
from spoc_tui.sim.options import SCENARIOS, SimConfigError, SimOptions


def run_demo(scenario: str, model: str, gpu: str, tp: int | None, users: int | None, seed: int) -> int:
    opts = SimOptions(model=model, gpu=gpu, tp=tp, scenario=scenario, seed=seed)
    if users is not None and users < 0:
        print("spoc demo: error: --users must be 0 or more", file=sys.stderr)
        return EXIT_USAGE
    from spoc_tui.sim.run import build, demo_users, replica_count

    try:
        engine, _ = build(opts)  # validate before starting anything
    except SimConfigError as e:
        print(f"spoc demo: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    from spoc_tui.core.errors import InputError
    from spoc_tui.tui.terminal import require_terminal

    try:
        require_terminal("spoc demo")  # before the simulator starts
    except InputError as e:
        print(f"spoc demo: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    n_users = users if users is not None else demo_users(scenario, engine)
    replicas = replica_count(opts)
    if replicas > 1:
        port, dport = free_block(replicas), free_block(replicas)
    else:
        port, dport = free_ports(2)
    args = [
        "--model",
        model,
        "--gpu",
        gpu,
        "--scenario",
        scenario,
        "--seed",
        str(seed),
        "--dcgm-port",
        str(dport),
        "--load-users",
        str(n_users),
    ]
    if tp is not None:
        args += ["--tp", str(tp)]
    if replicas > 1:
        args += ["--replicas", str(replicas)]
    print(
        f"spoc demo: starting the SIMULATED {model} on {gpu} ({scenario}, {n_users} users"
        + (f", {replicas} replicas" if replicas > 1 else "")
        + ")...",
        flush=True,
    )
    from spoc_tui.procs.server import LaunchError
    from spoc_tui.sim.process import start_sim
    from spoc_tui.tui.app import run_monitor

    try:
        server = start_sim(args, port)
    except LaunchError as e:
        print(f"spoc demo: error: {e}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        settings = Settings(
            vllm_urls=[f"http://127.0.0.1:{port + i}" for i in range(replicas)],
            dcgm_urls=[f"http://127.0.0.1:{dport + i}/metrics" for i in range(replicas)],
            nvml=False,
            tp_groups=f"0-{engine.cfg.tp - 1}" if engine.cfg.tp > 1 else None,
            interval=1.0,
            window=30.0,
            max_num_seqs=engine.cfg.max_num_seqs,  # told, as an operator would tell it of the server
            tune_launch=f"{sys.executable} -m spoc_tui.cli sim {model} --gpu {gpu} --port {{port}} --dcgm-port "
            f"0 {{flags}}",
        )
        return run_monitor(settings)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        server.stop(grace=5.0)


@click.command("demo")
@default_option(
    "--scenario",
    SimOptions.scenario,
    "fleet: three replicas behind a round-robin split, one of them lagging.",
    type=click.Choice(SCENARIOS),
)
@default_option("--model", SimOptions.model, "Model preset of the simulated server.")
@default_option("--gpu", SimOptions.gpu, f"GPU preset: {', '.join(GPUS)}.")
@click.option("--tp", type=int, help="Tensor-parallel size [default: 1; thermal: 4].")
@click.option("--users", type=int, help="Background users (default: 48, overload: 3x max-num-seqs).")
@default_option("--seed", SimOptions.seed, "Random seed of the simulator.", type=int)
def demo_cmd(scenario: str, model: str, gpu: str, tp: int | None, users: int | None, seed: int) -> None:
    """Start the simulator with a background load and open the monitor on it.

    Everything runs on loopback and is stopped when the monitor exits (Ctrl-C included).
    """
    sys.exit(run_demo(scenario=scenario, model=model, gpu=gpu, tp=tp, users=users, seed=seed))
