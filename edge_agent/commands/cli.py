"""The ``edge-agent`` command line.

Sub-commands live in ``edge_agent/commands/<name>.py`` (each defines ``command``) and are imported
only when used, so ``edge-agent --help`` never loads llama.cpp or Textual.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from edge_agent.core.errors import EdgeAgentError
from edge_agent.core.recovery import take_notices

# name -> short help (shown without importing the module)
COMMANDS = {
    "tui": "Open the app (the default).",
    "ask": "Ask one question about an image and print the answer.",
    "chats": "List saved chats (the app's and ask's): ids for `ask --chat ID`.",
    "models": "List, pull, add, verify and remove models.",
    "cache": "Inspect, export, import, clear or prefetch the search cache.",
    "config": "Show or change settings.",
    "eval": "Evaluate answer quality and latency on a JSONL question set.",
    "library": "Build, show and check SSR rationale libraries.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        try:
            module = importlib.import_module(f"edge_agent.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"edge_agent.commands.{name}":
                return None
            raise
        return module.command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # The app is the default command, options included (as llm and posting do): `edge-agent --model X`
        # and `edge-agent --chat 3` mean `edge-agent tui --model X` ...; the group's own options stay its own.
        if args and args[0].startswith("-") and args[0].split("=")[0] not in (*ctx.help_option_names,
                                                                              "--version"):
            args = ["tui", *args]
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl(list(COMMANDS.items()))

    def invoke(self, ctx: click.Context):  # user errors: one line, no traceback
        try:
            return super().invoke(ctx)
        except EdgeAgentError as e:
            if os.environ.get("EDGE_AGENT_DEBUG"):
                raise
            click.echo(f"Error: {e}", err=True)
            ctx.exit(2)
        # a write no command expected to fail (read-only home, full disk): said, not a traceback
        except OSError as e:
            from edge_agent.core.files import FULL, NOT_ALLOWED, READ_ONLY, write_error

            if os.environ.get("EDGE_AGENT_DEBUG") or e.errno not in (*READ_ONLY, *FULL, *NOT_ALLOWED):
                raise
            click.echo(f"Error: {write_error(e.filename or 'a file', e)}", err=True)
            ctx.exit(2)
        finally:  # a damaged file recovered on the way (chats, config, search cache): said once, here
            for message in take_notices():
                click.echo(f"Note: {message}", err=True)


@click.group(cls=LazyGroup, invoke_without_command=True)
@click.version_option(package_name="edge-agent")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """edge-agent: ask a small local vision-language model about your images.

    \b
    Examples:
      edge-agent                                  open the app
      edge-agent --model MODEL.gguf --chat 12     the app's options work without `tui`
      edge-agent models pull qwen3-vl-2b-instruct  download a model (GGUF + mmproj)
      edge-agent ask photo.jpg "What does the small sign say?"
      edge-agent ask photo.jpg "Where is this?" --offline --json
      edge-agent cache stats
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(cli.get_command(ctx, "tui"))


ARGV: list[str] | None = None  # the command line of this process, when it was started as `edge-agent ...`


def main() -> None:
    import edge_agent.commands.cli as this  # the module the commands import (not __main__ under `python -m`)

    this.ARGV = sys.argv[1:]
    cli(prog_name="edge-agent")


if __name__ == "__main__":
    sys.exit(main())
