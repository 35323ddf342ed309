"""The engine: the composition root, its face, the read-ahead, measured costs, neutral scores."""
