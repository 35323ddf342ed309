"""`edge-agent config`: show, explain and change settings (stored in HOME/config.toml)."""

from __future__ import annotations

import json
from dataclasses import fields

import click

from edge_agent.config import SECRET_FIELDS, Settings


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
    s = Settings.load({key: value})
    path = s.save()
    shown = "***" if key in SECRET_FIELDS else getattr(s, key)
    click.echo(f"{key} = {shown}  (saved to {path})")


@command.command("explain")
def explain() -> None:
    """Describe every setting."""
    for f in fields(Settings):
        click.echo(f"{f.name}\n    {f.metadata.get('doc', '')}")


@command.command("path")
def path() -> None:
    """Print the config file's path."""
    click.echo(Settings.load().config_path)
