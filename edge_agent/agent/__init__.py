"""The agent: prompts, the SSR rationale library and selection, action grammars, the turn loop.

No llama_cpp, no textual, no network here: the loop talks to a ``runtime.types.SessionLike`` and a
``toolbox.ToolExecutor`` and yields the typed events of ``events``.

- ``prompts``     Qwen3-VL chat format (system + tools, user turn, tool responses)
- ``rationales``  the rationale library (built-in ``edge_agent/data/rationales.json`` or a user file),
                  softmax selection
- ``actions``     action heads, grammars (GBNF) and parsing
- ``toolbox``     zoom (local) and the injected search tools behind one executor
- ``loop``        ``run_agent``: SSR and free-form turns, turn limit, cancellation, SeProD hooks
- ``seprod``      the prophet's drafts and their acceptance (SeProD)
"""
