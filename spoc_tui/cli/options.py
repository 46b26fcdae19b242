"""Options several commands share, declared once, and the one rule they read settings by:
command line, then environment (``SPOC_*``), then ``config.toml`` (``spoc locate config``, or
``SPOC_CONFIG``), then the default."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from spoc_tui.config import config_path, load_file, read_key_file
from spoc_tui.core.errors import InputError

CA_ENV = "SPOC_CA_BUNDLE"
"""As :data:`spoc_tui.collectors.http.CA_ENV` (not imported: httpx would load with every command's --help)."""
INSECURE_ENV = "SPOC_INSECURE"

F = TypeVar("F", bound=Callable[..., Any])

API_KEY_ENV = "SPOC_API_KEY"
SLA_ENV = "SPOC_SLA"
CONFIG_ENV = "SPOC_CONFIG"


def config_values(config_file: str | None = None) -> dict[str, object]:
    """The settings of ``config.toml`` (``config_file``, else ``SPOC_CONFIG``, else the platform's
    config folder); a missing default file is an empty config.

    Raises:
        ConfigError: a bad file, or a named file that does not exist.
    """
    named = config_file or os.environ.get(CONFIG_ENV)
    path = Path(named) if named else config_path()
    if named and not path.exists():
        raise InputError(f"config file {path}: no such file")
    return load_file(path)


def api_key_options(help_text: str = "Bearer token for the server (never printed or written).") -> Callable[[F], F]:
    """``--api-key`` (``SPOC_API_KEY``) and ``--api-key-file``, then ``config.toml``'s
    ``api_key_file``: the key a command's clients send. A key on the command line shows in ``ps``
    and the shell's history; a file's does not. Both at once are refused, as is a key beside a
    URL's ``user:pass@``."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, api_key: str | None = None, api_key_file: str | None = None, **kw: Any) -> Any:
            if api_key_file is not None:
                if api_key:
                    raise InputError("give --api-key or --api-key-file, not both")
                api_key = read_key_file(api_key_file, f"--api-key-file {api_key_file}")
                if not api_key:
                    raise InputError(f"--api-key-file {api_key_file}: the file is empty")
            if not api_key:
                key = config_values().get("api_key")
                api_key = str(key) if key else None
            urls = [kw.get("url") or "", *(kw.get("sources") or ()), *(kw.get("dcgm_urls") or ())]
            from spoc_tui.collectors.http import check_credentials  # httpx: only when a command runs

            check_credentials([u for u in urls if u], api_key)
            return f(*args, api_key=api_key, **kw)

        opt_file = click.option(
            "--api-key-file",
            type=click.Path(dir_okay=False),
            help="Read the bearer token from this file (a key on the command line shows in ps) "
            "[default: config.toml's api_key_file].",
        )
        opt_key = click.option("--api-key", envvar=API_KEY_ENV, show_envvar=True, help=help_text)
        return cast(F, opt_key(opt_file(wrapper)))

    return decorate


def tls_options(f: F) -> F:
    """``--ca-bundle`` and ``--insecure``: the one TLS rule of every client (collectors.http)."""

    @functools.wraps(f)
    def wrapper(*args: Any, ca_bundle: str | None = None, insecure: bool = False, **kw: Any) -> Any:
        from spoc_tui.collectors.http import configure_tls

        configure_tls(ca_bundle, insecure)
        if insecure:
            click.echo("spoc: warning: --insecure: TLS certificates are not checked", err=True)
        return f(*args, **kw)

    f2 = click.option(
        "--insecure",
        is_flag=True,
        envvar=INSECURE_ENV,
        show_envvar=True,
        help="Do not check TLS certificates (a self-signed bring-up host).",
    )(wrapper)
    f3 = click.option(
        "--ca-bundle",
        type=click.Path(dir_okay=False),
        envvar=CA_ENV,
        show_envvar=True,
        help="Check TLS certificates against this CA file (PEM) [default: the system's store, or SSL_CERT_FILE].",
    )(f2)
    return cast(F, f3)


def sla_option(what: str, fallback: str | None = None) -> Callable[[F], F]:
    """``--sla`` (``SPOC_SLA``), read by the one rule (then config.toml's ``sla``): ``what`` its
    limits are for, and ``fallback`` the SLA used when neither gives one (None: none)."""
    default = f"config.toml's sla, else {fallback}" if fallback else "config.toml's sla"
    return click.option("--sla", envvar=SLA_ENV, show_envvar=True, help=f"{what} [default: {default}].")


def default_option(flag: str, default: Any, help_text: str, *names: str, **kw: Any) -> Callable[[F], F]:
    """An option whose default ``--help`` shows."""
    return click.option(flag, *names, default=default, show_default=True, help=help_text, **kw)


def env_option(flag: str, env: str, help_text: str, *names: str, **kw: Any) -> Callable[[F], F]:
    """An option its environment variable ``env`` may also set (``--help`` shows which)."""
    return click.option(flag, *names, envvar=env, show_envvar=True, help=help_text, **kw)


def file_option(flag: str, dest: str, help_text: str, **kw: Any) -> Callable[[F], F]:
    """An option naming a file (not a folder), stored as ``dest``."""
    return click.option(flag, dest, type=click.Path(dir_okay=False), help=help_text, **kw)


def json_option(help_text: str = "Print one JSON object.") -> Callable[[F], F]:
    """``--json`` (``as_json``): one JSON object on standard output instead of text."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def twin_option(help_text: str, dest: str = "twin_path", **kw: Any) -> Callable[[F], F]:
    """``--twin``: a calibrated twin.json (``spoc twin calibrate``), stored as ``dest`` (None unless
    ``kw`` gives a default)."""
    return click.option("--twin", dest, help=help_text, **kw)


def seats_option(help_text: str, *names: str) -> Callable[[F], F]:
    """``--max-num-seqs`` where the headroom is learned: the servers' seats (vLLM's flag), which
    ``/metrics`` does not report (None: not told)."""
    return click.option("--max-num-seqs", *names, type=int, help=help_text)


def served_model_option(f: F) -> F:
    """``--model``: the served model name a client asks for."""
    opt = click.option("--model", help="Served model name [default: the server's first].")
    return opt(f)


def from_config(
    value: str | None, key: str, flag: str, values: dict[str, object] | None = None, default: str | None = None
) -> str:
    """A setting by the one rule: the flag (or its ``SPOC_*`` variable), else ``config.toml``'s
    ``key`` (a list's first entry: ``vllm_urls``), else ``default``; ``values``: the file
    already read.

    Raises:
        InputError: none of them gives it.
    """
    if value:
        return value
    found = (config_values() if values is None else values).get(key)
    if isinstance(found, list):
        found = found[0] if found else None
    if not found and default is not None:
        return default
    if not found:
        raise InputError(f"{flag} is needed (or {key} in config.toml, see spoc locate config)")
    return str(found)
