"""Plain helpers every layer may use: errors, settings, files, recovery, redaction, SQLite, text."""
