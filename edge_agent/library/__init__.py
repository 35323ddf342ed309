"""Offline tooling: building an SSR rationale library from the agent's own free-form traces.

Not part of answering a question (the agent only loads a library: ``agent.rationales``); used by
``edge-agent library build``. Pure: no llama_cpp, no network, no files written but the one asked for.

- ``readers``     eval results, exported chats and ``ask --json`` logs -> free-form turns
- ``generalise``  one turn's reasoning -> a generic move (its decision sentence, specifics removed)
- ``cluster``     TF-IDF vectors and average-linkage clustering on cosine similarity
- ``build``       moves -> clusters per action -> representatives under the caps (``build_library``)
- ``write``       the library file: the loader's format plus provenance (``write_library``)
"""
