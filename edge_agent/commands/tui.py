"""``edge-agent tui`` (also plain ``edge-agent``): open the app.

Heavy imports (Textual, the app) happen inside the command, so ``edge-agent --help`` stays fast;
llama.cpp is imported later still, by the app's model-loading worker.
"""

from __future__ import annotations

import click


@click.command("tui")
@click.option("--model", default=None, help="Agent model: a catalog name or a GGUF path (this run only).")
@click.option("--mmproj", default=None, help="Vision projector GGUF for --model.")
@click.option("--prophet", default=None, help="SeProD prophet model: a catalog name or a GGUF path.")
@click.option("--prophet-mmproj", default=None, help="Vision projector GGUF for --prophet.")
@click.option("--mode", type=click.Choice(["ssr", "freeform", "direct"]), default=None,
              help="Reasoning mode.")
@click.option("--offline", is_flag=True, default=None, help="Serve searches from the cache only.")
@click.option("--chat", "chat_id", type=int, default=None, help="Open this chat (see the chat list, Ctrl+O).")
def command(model, mmproj, prophet, prophet_mmproj, mode, offline, chat_id) -> None:
    """Open the app: attach an image, ask, watch the reasoning.

    \b
    Keys: Ctrl+F attach image · Esc stop answer · Ctrl+T reasoning · Ctrl+R mode (SSR, free-form, direct)
          Ctrl+O chats · Ctrl+N new chat · Ctrl+S settings · Ctrl+P all commands · Ctrl+Q quit
    """
    from edge_agent.core.config import Settings
    from edge_agent.ui.widgets.preview import enable_graphics

    settings = Settings.load({"model": model, "mmproj": mmproj, "prophet": prophet,
                              "prophet_mmproj": prophet_mmproj,
                              "mode": mode, "offline": offline})
    enable_graphics()  # queries the terminal: must happen before Textual takes it over

    from edge_agent.ui.app import EdgeAgentApp

    app = EdgeAgentApp(settings, open_chat=chat_id)
    app.run()
