"""`edge-agent config`: show, explain and change settings (stored in HOME/config.toml)."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import click

from edge_agent.core.config import SECRET_FIELDS, Settings
from edge_agent.core.errors import ConfigError


@click.group("config")
def command() -> None:
    """Show or change settings. Environment variables EDGE_AGENT_<NAME> override the file."""


@command.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(as_json: bool) -> None:
    """Print every setting and its value (secrets masked)."""
    s = Settings.load()
    d = s.public_dict()
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    width = max(map(len, d))
    for k, v in d.items():
        click.echo(f"{k:<{width}}  {v}")
    click.echo(f"\n(file: {s.config_path})")


# ignore_unknown_options: a negative VALUE ("-1") is a value for the validator, not an option
@command.command("set", context_settings={"ignore_unknown_options": True})
@click.argument("key")
@click.argument("value")
def set_(key: str, value: str) -> None:
    """Set KEY to VALUE in the config file, e.g. `edge-agent config set mode freeform`."""
    # The new value is applied before validation, so a file holding a bad value can be fixed here.
    from edge_agent.agent.prompts import check_n_ctx

    s = Settings.load({key: value},
                      check=check_n_ctx)  # n_ctx: what the system prompt of these settings needs
    _check_files(s, key)
    path = s.save()
    if key in SECRET_FIELDS:  # a key is never printed; an emptied one is said to be gone
        click.echo(f"{key} {'= ***' if getattr(s, key) else 'removed'}  (saved to {path})")
    else:
        click.echo(f"{key} = {getattr(s, key)}  (saved to {path})")


@command.command("unset")
@click.argument("key")
def unset(key: str) -> None:
    """Remove KEY from the config file: it takes its default again (an API key is removed)."""
    from edge_agent.core.config import _dump_toml, _read_config
    from edge_agent.core.files import atomic_write

    default = Settings()
    if key not in {f.name for f in fields(Settings)} or key == "home":
        names = ", ".join(sorted(f.name for f in fields(Settings) if f.name != "home"))
        raise ConfigError(f"Unknown setting {key!r}. Known settings: {names}.")
    path = Settings.load().config_path
    values = _read_config(path) if path.exists() else {}
    if values.pop(key, None) is not None:
        atomic_write(path, _dump_toml(values), private=True)
    if key in SECRET_FIELDS:
        click.echo(f"{key} removed  ({path})")
    else:
        click.echo(f"{key} = {getattr(default, key)} (the default)  ({path})")
    env = f"EDGE_AGENT_{key.upper()}"
    if env in os.environ:
        click.echo(f"Note: {env} is set in the environment and still overrides the file.", err=True)


def _check_files(s: Settings, key: str) -> None:
    """A model, mmproj or rationale library that cannot be found is refused when set (reading the file
    later does not check them: a model may be pulled after it is named, and `ask` says what is missing)."""
    value = getattr(s, key)
    if not value:
        return
    if key in ("model", "prophet"):
        from edge_agent.modelfiles.resolution import find_model

        find_model(s, value, detect_mmproj=False)
    elif key in ("mmproj", "prophet_mmproj") and not Path(value).expanduser().is_file():
        raise ConfigError(f"Setting {key}: no file {value}. Give the path of the vision projector GGUF (its "
                          f"name "
                          "usually starts with 'mmproj'), or an empty value for none.")
    elif key == "rationales":
        from edge_agent.agent.rationales import load_library

        load_library(value)


@command.command("explain")
def explain() -> None:
    """Describe every setting."""
    from edge_agent.agent.prompts import min_n_ctx
    from edge_agent.core.config import CHOICES, RANGES, URL_FIELDS

    for f in fields(Settings):
        click.echo(f"{f.name}\n    {f.metadata.get('doc', '')}")
        if f.name in CHOICES:
            click.echo(f"    valid: {', '.join(CHOICES[f.name])}")
        elif f.name in RANGES:
            lo, hi, lo_open = RANGES[f.name]
            lo = min_n_ctx(Settings()) if f.name == "n_ctx" else lo  # what the default system prompt needs
            click.echo(f"    valid: {'>' if lo_open else '>='} {lo}" + (f", <= {hi}" if hi is not None
                                                                        else ""))
        elif f.name in URL_FIELDS:
            click.echo("    valid: an http:// or https:// URL" + (", or empty" if f.name in ("searxng_url",
                    "public_image_url_prefix") else ""))


@command.command("path")
def path() -> None:
    """Print the config file's path."""
    click.echo(Settings.load().config_path)
