"""Model files: the catalog, GGUF reading and checks, memory footprints, downloads."""
