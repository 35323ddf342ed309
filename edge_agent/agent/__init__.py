"""The agent: what answers one question: prompts, the SSR rationale library and selection, action
grammars, the turn loop, SeProD.

No llama_cpp, no textual, no network here: the loop talks to a ``runtime.types.SessionLike`` (SeProD's
prophet: a ``runtime.types.DraftModelLike``) and a ``toolbox.ToolExecutor`` and yields the typed events of
``events``. Offline tooling that is not part of answering (building a rationale library from traces) lives in
``edge_agent.library``.

- ``prompts``        Qwen3-VL chat format (system + tools, user turn, tool responses)
- ``rationales``     the rationale library (built-in ``edge_agent/data/rationales.json`` or a user file),
                     softmax selection
- ``actions``        action heads, grammars (GBNF) and parsing
- ``toolbox``        zoom (local) and the injected search tools behind one executor
- ``events``         the typed events the loop yields (and their JSON form)
- ``options``        ``AgentOptions`` and the ``DraftHooks`` protocol the loop calls
- ``context``        how a question's context is opened and kept (``ChatContext``, ``FreshContext``)
- ``loop``           ``run_agent``: SSR and free-form turns, turn limit, cancellation, SeProD hooks
- ``seprod``         the prophet's drafts and their acceptance (SeProD's ``Drafter``)
- ``seprod_math``    SeProD's pure parts: acceptance maths, the prophet's queries, values
- ``seprod_policy``  SeProD's costs and the adaptive rule (when a draft is worth it)
"""
