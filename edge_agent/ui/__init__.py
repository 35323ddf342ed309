"""The Textual app. The only package that imports textual; it consumes agent events and never
calls the model on the UI thread: ``host.EngineHost`` owns the engine, its lock and the worker threads
that use it, and screens talk to the engine only through it."""
