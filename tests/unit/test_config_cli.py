import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spoc_tui.collectors.promql import to_expositions
from spoc_tui.config import ConfigError, load_file


def run(*argv, env=None):
    return subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", *argv], capture_output=True, text=True, timeout=60, env=env
    )


def test_config_file_errors(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("vllm_urls = [1]\n")
    with pytest.raises(ConfigError, match="list of strings"):
        load_file(f)
    f.write_text("colour = 'red'\n")
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        load_file(f)
    f.write_text("interval = \n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_file(f)
    f.write_text('vllm-urls = "http://a:8000"\ninterval = 2\n')
    assert load_file(f) == {"vllm_urls": ["http://a:8000"], "interval": 2.0}


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["monitor", "--interval", "0"], "interval must be between"),
        (["monitor", "--url", "ftp://x"], "not an http(s) URL"),
        (["monitor", "--tp-groups", "0-"], "bad TP group"),
        (["monitor", "--config", "/nonexistent.toml"], "does not exist"),
        (["inspect", "x.txt", "--interval", "-1"], "--interval must be"),
        (["sim", "--gpu", "v100"], "unknown GPU"),
        (["demo", "--scenario", "chaos"], "'chaos' is not one of"),
        (["monitor", "--sla", "ttft<2s", "--url", "http://127.0.0.1:9"], "sla: cannot parse SLA clause"),
        # a key in a file on every command that takes a key (a key on the command line shows in ps)
        (["inspect", "x.txt", "--api-key-file", "/nonexistent"], "--api-key-file /nonexistent: cannot read"),
        (
            [
                "ramp",
                "--url",
                "http://127.0.0.1:9",
                "--sla",
                "ttft_p99<=1s",
                "--out",
                "o",
                "--api-key-file",
                "/nonexistent",
            ],
            "--api-key-file /nonexistent",
        ),
        (
            [
                "tune",
                "--launch",
                "x {port}",
                "--sla",
                "ttft_p99<=1s",
                "--out",
                "o",
                "--api-key-file",
                "/x",
                "--api-key",
                "k",
            ],
            "give --api-key or --api-key-file, not both",
        ),
        (["replay", "/nonexistent.jsonl"], "cannot read"),
        # bad input that once got through (one line, exit 2, never a traceback)
        (["monitor", "--url", "http://[::1", "--no-nvml"], "not a valid URL"),
        (["monitor", "--url", "http://127.0.0.1:99999", "--no-nvml"], "not a valid URL"),
        (["inspect", "http://[::1:19100"], "not a valid URL"),
        (["inspect", "/dev/zero"], "not a regular file"),
        # a file that never ends, named where a file is read whole or line by line: refused, not read for ever
        (
            ["ramp", "--url", "http://127.0.0.1:1", "--out", "o", "--profile", "/dev/zero"],
            "/dev/zero: cannot read (not a regular file)",
        ),
        (
            ["ramp", "--url", "http://127.0.0.1:1", "--out", "o", "--api-key-file", "/dev/zero"],
            "--api-key-file /dev/zero: cannot read (not a regular file)",
        ),
        (["monitor", "--config", "/dev/zero", "--no-nvml"], "/dev/zero: cannot read (not a regular file)"),
        (["replay", "/dev/zero"], "/dev/zero: cannot read (not a regular file)"),
        (["trace", "stats", "/dev/zero"], "/dev/zero: not a regular file"),
        (["profile", "--from-trace", "/dev/zero"], "/dev/zero: not a regular file"),
        (
            ["ramp", "--url", "http://127.0.0.1:1", "--out", "o", "--trace", "/dev/zero"],
            "--trace /dev/zero: not a regular file",
        ),
        (
            ["tune", "--launch", "/bin/true {port}", "--sla", "ttft_p99<=1s", "--out", "o", "--space", "/dev/zero"],
            "--space /dev/zero: not a regular file",
        ),
        (["monitor", "--nvml-trace", "/dev/zero", "--no-nvml"], "not a regular file"),
        # the headroom's told seats and prior twin, checked before the screen starts
        (["monitor", "--max-num-seqs", "0", "--no-nvml"], "max_num_seqs must be between 1 and 65536, got 0"),
        (["monitor", "--twin", "/nonexistent.json", "--no-nvml"], "twin: /nonexistent.json:"),
        (["monitor", "--nvml-trace", "tests/fixtures/h100_nvml_trace.jsonl.gz", "--no-nvml"], "no such file"),
        (["sim", "--port", "99999"], "--port must be between 0 and 65535"),
        (["sim", "--port", "-1"], "--port must be between 0 and 65535"),
        (["sim", "--speed", "-1"], "--speed must be a positive number"),
        (["sim", "--speed", "nan"], "'nan' is not a finite number"),  # every float flag: nan/inf refused
        (
            ["ramp", "--url", "u", "--sla", "itl_p99<=1s", "--out", "o", "--step-seconds", "inf"],
            "'inf' is not a finite",
        ),
        (["demo", "--users", "-5"], "--users must be 0 or more"),
        (
            ["ramp", "--url", "http://127.0.0.1:1", "--sla", "itl_p99<=100", "--out", "o"],
            "has no unit: write 100ms or 100s",
        ),
        (
            ["ramp", "--url", "http://127.0.0.1:1", "--sla", "itl_p99<=1s", "--out", "o", "--abort-factor", "-1"],
            "--abort-factor must be",
        ),
        (
            ["ramp", "--url", "http://127.0.0.1:1", "--sla", "itl_p99<=1s", "--out", "o", "--workers", "100000"],
            "--workers must be between",
        ),
        (
            ["ramp", "--url", "http://127.0.0.1:1", "--sla", "itl_p99<=1s", "--out", "o", "--users", "auto:x"],
            "auto:MAX",
        ),
        (
            ["ramp", "--url", "http://127.0.0.1:1", "--sla", "itl_p99<=1s", "--out", "o", "--max-step-seconds", "1"],
            "--max-step-seconds",
        ),
        (
            [
                "capacity",
                "--model",
                "llama-3.1-8b",
                "--gpu",
                "h100-80gb",
                "--queue",
                "1,2",
                "--service-time",
                "-1",
                "--think-time",
                "1",
            ],
            "--service-time must be",
        ),
        (
            [
                "tune",
                "--launch",
                f"{sys.executable} x --port {{port}} {{flags}}",
                "--sla",
                "ttft_p99<=1s",
                "--out",
                "o",
                "--start-timeout",
                "-1",
            ],
            "--start-timeout must be",
        ),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv, msg, tmp_path):
    r = run(*argv)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr


def test_monitor_reads_the_config_file_and_flags_win(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from spoc_tui import cli

    cfg = tmp_path / "c.toml"
    cfg.write_text('vllm_urls = ["http://a:8000"]\ninterval = 5\nwindow = 30\n')
    seen = {}

    def fake_run(settings, record=None):
        seen["s"] = settings
        return 0

    monkeypatch.setattr("spoc_tui.tui.app.run_monitor", fake_run)
    r = CliRunner().invoke(cli.cli, ["monitor", "--config", str(cfg), "--interval", "2"])
    assert r.exit_code == 0, r.output
    s = seen["s"]
    assert s.vllm_urls == ["http://a:8000"] and s.interval == 2 and s.window == 30
    assert s.max_num_seqs is None and s.twin is None
    # the headroom's told seats, from the file and then from the flag
    cfg.write_text('vllm_urls = ["http://a:8000"]\nmax-num-seqs = 48\n')
    r = CliRunner().invoke(cli.cli, ["monitor", "--config", str(cfg)])
    assert r.exit_code == 0 and seen["s"].max_num_seqs == 48, r.output
    r = CliRunner().invoke(cli.cli, ["monitor", "--config", str(cfg), "--max-num-seqs", "64"])
    assert r.exit_code == 0 and seen["s"].max_num_seqs == 64, r.output
    for bad in ("4.5", "true", '"48"'):
        cfg.write_text(f"max_num_seqs = {bad}\n")
        with pytest.raises(ConfigError, match="max_num_seqs must be a whole number"):
            load_file(cfg)


def test_prometheus_vector_to_expositions_restores_vllm_names():
    result = [
        {
            "metric": {
                "__name__": "vllm_num_requests_running",
                "instance": "a:1",
                "job": "vllm",
                "engine": "0",
                "model_name": "m",
            },
            "value": [1, "3"],
        },
        {
            "metric": {
                "__name__": "vllm:num_requests_running",
                "instance": "b:1",
                "job": "vllm",
                "engine": "0",
                "model_name": "m",
            },
            "value": [1, "4"],
        },
        {"metric": {"__name__": "x", "instance": "b:1"}, "value": [1, "nan-ish"]},
        {"metric": {"__name__": "vllm:num_requests_waiting", "instance": "b:1"}, "value": [1, "NaN"]},
        {"metric": {"__name__": "vllm:num_preemptions_total", "instance": "b:1"}, "value": [1, "+Inf"]},
    ]
    exps = to_expositions(result)
    # Prometheus' NaN and ±Inf are no data, as the exposition parser has them (never "inf" on screen)
    assert not exps["b:1"].has("vllm:num_requests_waiting") and not exps["b:1"].has("vllm:num_preemptions_total")
    assert exps["b:1"].nonfinite == 2
    assert exps["a:1"].get("vllm:num_requests_running") == {(("engine", "0"), ("model_name", "m")): 3.0}
    assert exps["b:1"].get("vllm:num_requests_running")[(("engine", "0"), ("model_name", "m"))] == 4.0


def test_traces_and_replays_that_cannot_be_read_are_one_line(tmp_path):
    binary = tmp_path / "trace.jsonl"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    r = run("monitor", "--nvml-trace", str(binary), "--no-nvml")
    assert r.returncode == 2 and "not UTF-8 text" in r.stderr and "Traceback" not in r.stderr
    notjson = tmp_path / "t2.jsonl"
    notjson.write_text("[1]\n")
    r = run("monitor", "--nvml-trace", str(notjson), "--no-nvml")
    assert r.returncode == 2 and "line 1: not a JSON object" in r.stderr
    prof = tmp_path / "replay.toml"
    prof.write_text('name = "r"\nreplay = "/dev/zero"\n')
    r = run("ramp", "--url", "http://127.0.0.1:1", "--profile", str(prof), "--sla", "ttft_p99<=1s", "--out", "o")
    assert r.returncode == 2 and "replay /dev/zero: not a regular file" in r.stderr


def test_every_option_has_help_and_defaults_read_one_way():
    """CLI conventions: each option says what it does; a default is shown as click shows it."""
    import re

    import click

    from spoc_tui.cli.main import cli

    for name, cmd in cli.commands.items():
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.hidden:
                continue
            assert p.help, f"spoc {name} {p.opts[0]} has no help"
            assert not re.search(r"\[(?!default:)[^\]]*\]\.?$", p.help), f"spoc {name} {p.opts[0]}: {p.help!r}"


def test_every_client_command_reads_the_api_key_by_one_rule(tmp_path, monkeypatch):
    """--api-key, then SPOC_API_KEY, then --api-key-file, then config.toml's api_key_file: the same
    for inspect, ramp, tune and profile (they share cli/options.api_key_options)."""
    import click
    from click.testing import CliRunner

    from spoc_tui.cli.options import api_key_options

    @click.command()
    @api_key_options()
    def show(api_key):
        click.echo(f"key={api_key}")

    (tmp_path / "key").write_text("from-file\n")
    (tmp_path / "config.toml").write_text(f'api_key_file = "{tmp_path / "key"}"\n')
    monkeypatch.setenv("SPOC_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.delenv("SPOC_API_KEY", raising=False)
    run = CliRunner().invoke
    assert run(show, []).output.strip() == "key=from-file"  # config.toml
    assert run(show, ["--api-key", "flag"]).output.strip() == "key=flag"
    assert run(show, [], env={"SPOC_API_KEY": "env"}).output.strip() == "key=env"
    (tmp_path / "other").write_text("other")
    assert run(show, ["--api-key-file", str(tmp_path / "other")]).output.strip() == "key=other"
    both = run(show, ["--api-key", "a", "--api-key-file", str(tmp_path / "other")])
    assert both.exit_code != 0 and "not both" in str(both.exception)
    monkeypatch.setenv("SPOC_CONFIG", str(tmp_path / "missing.toml"))
    assert "no such file" in str(run(show, []).exception)
    for cmd in ("inspect", "ramp", "tune", "profile"):
        out = subprocess.run([sys.executable, "-m", "spoc_tui.cli", cmd, "--help"], capture_output=True, text=True)
        assert "--api-key-file" in out.stdout and "config.toml" in out.stdout, cmd


def test_ramp_and_tune_take_the_server_and_the_sla_by_the_same_rule(tmp_path):
    """--url and --sla (or SPOC_VLLM_URL, SPOC_SLA), else config.toml's vllm_urls and sla, else a
    one-line error naming both (spoc ramp's SLA: else the default)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('vllm_urls = ["http://127.0.0.1:9"]\nsla = "ttft_p99<=2s"\n')
    env = {**os.environ, "SPOC_CONFIG": str(cfg)}
    env.pop("SPOC_VLLM_URL", None)
    env.pop("SPOC_SLA", None)
    argv = [sys.executable, "-m", "spoc_tui.cli", "ramp", "--out", str(tmp_path / "out")]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    # the config's server was asked (nothing listens on port 9): the ramp got its URL and SLA there
    assert r.returncode == 1 and "127.0.0.1:9: cannot reach the server" in r.stderr, r.stderr
    cfg.write_text("")
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "--url is needed (or vllm_urls in config.toml" in r.stderr
    # no SLA anywhere: spoc ramp holds the default (ttft_p99<=2s,itl_p99<=100ms) and goes on to the server
    r = subprocess.run([*argv, "--url", "http://127.0.0.1:9"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1 and "127.0.0.1:9: cannot reach the server" in r.stderr, r.stderr
    r = subprocess.run(
        [*argv, "--url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60,
        env={**env, "SPOC_SLA": "error_rate<=1"},
    )  # fmt: skip
    assert r.returncode == 2 and "write error_rate<=1%" in r.stderr


def test_the_command_line_loads_no_heavy_module_until_a_command_runs():
    """`spoc --help` stays fast (issue 35: it took 0.4-0.7 s): the CLI module loads none of
    numpy, httpx, Optuna, Textual, Locust or aiohttp; the commands import them when they run
    (benchmarks/cli_startup.py times it)."""
    import subprocess
    import sys

    code = (
        "import sys, spoc_tui.cli.main; "
        "print(','.join(m for m in ('numpy','httpx','optuna','textual','locust','gevent','aiohttp') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout + r.stderr
    from spoc_tui.cli import options
    from spoc_tui.collectors import http

    assert (options.CA_ENV, options.INSECURE_ENV) == (http.CA_ENV, http.INSECURE_ENV)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"Bearer SEKRETKEY42\n# prod\n", "holds more than one line"),
        (b"SEKRETKEY42\n# prod\n", "holds more than one line"),
        (b"Bearer SEKRETKEY42\n", "holds a space inside it"),
        (b"SEKRET\x01KEY42\n", "holds a control character"),
        (b"SEKR\xc3\xa9TKEY42\n", "holds a control character or one outside ASCII"),
    ],
)
def test_a_key_file_that_is_not_one_token_is_refused_naming_the_file_alone(tmp_path, content, says):
    """Issue 74: ``Bearer SEKRETKEY42\\n# prod`` was sent as a header (its second line as a raw
    header of its own through the monitor's client) and printed in an error. A key file holds one
    token: anything else is rc 2, one line naming the file, none of its content, nothing sent."""
    import socket

    from click.testing import CliRunner

    from spoc_tui.cli.main import cli

    key = tmp_path / "key"
    key.write_bytes(content)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        for argv in (["inspect", url], ["ramp", "--url", url, "--out", str(tmp_path / "o")]):
            r = CliRunner().invoke(cli, [*argv, "--api-key-file", str(key)])
            err = r.exception
            assert err is not None and getattr(err, "exit_code", None) == 2, (r.output, err)
            assert str(err).startswith(f"--api-key-file {key}: the file {says}")
            assert "SEKR" not in str(err) + r.output and "\n" not in str(err)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected


def test_a_key_file_with_a_byte_order_mark_is_read_and_a_header_never_breaks_a_line():
    import asyncio
    import tempfile

    from spoc_tui.collectors.lighthttp import HttpFailure, ScrapeClient
    from spoc_tui.config import read_key_file

    with tempfile.NamedTemporaryFile("wb", suffix=".key") as f:
        f.write("\ufeffSEKRETKEY42\r\n".encode())
        f.flush()
        assert read_key_file(f.name, "k") == "SEKRETKEY42"

    async def get() -> None:
        client = ScrapeClient()
        try:
            await client.get("http://127.0.0.1:1/metrics", {"Authorization": "Bearer a\r\nX-Injected: yes"}, 1000)
        finally:
            await client.aclose()

    with pytest.raises(HttpFailure, match="a request header holds a line break; nothing was sent"):
        asyncio.run(get())


HELP = Path(__file__).parents[1] / "fixtures" / "cli" / "help.json"


@pytest.mark.parametrize("command", ["ramp", "twin predict", "tune"])
def test_the_experiment_commands_help_is_as_pinned(command):
    """Issue 78: the experiment's options are made from one declaration of each step rule
    (:class:`spoc_tui.core.ramp.rules.StepRules`); ``--help`` reads as it did before (pinned at
    100 columns: tests/fixtures/cli/help.json, written from the commands as they were)."""
    env = {**os.environ, "COLUMNS": "100"}
    r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", *command.split(), "--help"], capture_output=True,
                       text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    want = json.loads(HELP.read_text())[command]
    assert r.stdout.replace("python -m spoc_tui.cli", "spoc") == want


def test_every_commands_help_is_as_pinned():
    """Issue 78: the options several commands share are declared once (``cli/options.py``); every
    command's ``--help`` reads as it did before they were (pinned at 100 columns:
    tests/fixtures/cli/help_all.json, written from the commands as they were). A change to a
    command's options shows here and is made on purpose: write the file again."""
    import click
    from click.testing import CliRunner

    from spoc_tui.cli.main import cli

    want = json.loads((HELP.parent / "help_all.json").read_text())
    got: dict[str, str] = {}

    def walk(cmd: click.Command, path: list[str]) -> None:
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                walk(sub, [*path, name])
        got[" ".join(path)] = CliRunner().invoke(cli, [*path, "--help"], prog_name="spoc", terminal_width=100).output

    walk(cli, [])
    assert sorted(got) == sorted(want)
    for command, text in want.items():
        assert got[command] == text, command
