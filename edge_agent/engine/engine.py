"""The composition root: settings -> models, tools and the agent loop, behind one ``ask`` call.

Used by ``edge-agent ask``, the TUI (in a worker thread), the eval and the benchmarks. Knows which
parts exist and how they are wired: the catalog resolves files, the runtime loads them, the search
tools come from settings, images are loaded and normalised here (so every caller gets the same
errors), and each question runs :func:`edge_agent.agent.loop.run_agent` on a session of the loaded
model. Does not know the chat format, the UI, or how any part works inside.

    engine = Engine.from_settings(Settings.load())
    for event in engine.ask("What does the sign say?", "photo.jpg"):
        ...
    engine.close()

One question at a time per engine (a llama context holds one conversation): callers serialise
(the TUI holds a lock). Chat continuity lives in ``chat.continuity.ChatContexts``: a follow-up question
(``context=`` the key its chat's last answer was saved under) is appended to the live KV cache or to
its saved state restored from disk; the system prompt is evaluated once per model and prompt on this
machine (its state is saved under ``home/states``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.agent.events import AgentError, Event, RunStarted
from edge_agent.agent.loop import run_agent, system_for
from edge_agent.agent.options import REASONING_MODES, AgentOptions, DraftHooks
from edge_agent.agent.prompts import check_n_ctx
from edge_agent.agent.rationales import Library, index_label, load_library
from edge_agent.agent.toolbox import SearchLike, Toolbox
from edge_agent.chat.continuity import AheadState, ChatContexts
from edge_agent.core.config import Settings
from edge_agent.core.errors import ConfigError, EdgeAgentError
from edge_agent.core.textclean import clean_event
from edge_agent.engine.calibration import FILE_NAME as NEUTRAL_FILE
from edge_agent.engine.calibration import NeutralScores, neutral_means
from edge_agent.engine.face import AskRequest, EngineFace, Images, ImageSource
from edge_agent.engine.images import ImageCache, as_list
from edge_agent.engine.images import label as images_label
from edge_agent.engine.measured import MeasuredCosts, costs_key
from edge_agent.engine.read_ahead import Reader, Target, stable_prefix
from edge_agent.runtime.state import StateStore
from edge_agent.runtime.types import ModelLike

if TYPE_CHECKING:
    from edge_agent.modelfiles.resolution import ResolvedModel
from edge_agent.tools.images import LoadedImage
from edge_agent.tools.zoom import ImageStore

Progress = Callable[[str, float], None]

# Settings that take new model files or a new llama context (or tools built at load): a new engine.
RELOAD_FIELDS = frozenset({"model", "mmproj", "prophet", "prophet_mmproj", "n_ctx", "n_threads",
                           "n_threads_batch",
                           "extra_buffers", "rationales", "text_search", "image_search"})


def needs_new_engine(old: Settings, new: Settings, changed: Collection[str], *, drafter_loaded: bool) -> bool:
    """Whether the ``changed`` settings (``old`` -> ``new``) take a new engine: new model files, context or
    tools (``RELOAD_FIELDS``), SeProD switched on while no prophet is loaded, or another bound on an image's
    tokens than the vision tower was loaded with (``Settings.vision_max_tokens``; a smaller crop within it
    is taken at the next zoom)."""
    if RELOAD_FIELDS.intersection(changed):
        return True
    if "seprod" in changed and new.seprod and new.prophet and not drafter_loaded:
        return True
    return old.vision_max_tokens != new.vision_max_tokens


def model_files(resolved: ResolvedModel) -> dict[str, str]:
    """The files of a resolved agent (and prophet) as a chat records them: absolute paths, "" for none."""
    def path(p: Path | None) -> str:
        return str(p.expanduser().resolve()) if p is not None else ""

    prophet = resolved.prophet
    return {"model": path(resolved.model_path), "mmproj": path(resolved.mmproj_path),
            "prophet": path(prophet.model_path if prophet else None),
            "prophet_mmproj": path(prophet.mmproj_path if prophet else None)}


def _loaded_files(model: ModelLike, prophet: ModelLike | None) -> dict[str, str]:
    """``Engine.files`` of an engine built from loaded models (tests): their paths, "" for none."""
    out: dict[str, str] = {}
    for role, mm, m in (("model", "mmproj", model), ("prophet", "prophet_mmproj", prophet)):
        out[role] = str(m.path) if m is not None else ""
        out[mm] = str(m.mmproj_path) if m is not None and m.mmproj_path is not None else ""
    return out


class Engine:
    """A loaded agent model with its tools. ``Engine(model, settings, tools=...)`` for tests."""

    def __init__(
        self,
        model: ModelLike,
        settings: Settings,
        *,
        tools: SearchLike | None = None,
        drafter: DraftHooks | None = None,
        library: Library | None = None,
        model_name: str = "",
        prophet: ModelLike | None = None,
        files: dict[str, str] | None = None,
        measured: MeasuredCosts | None = None,
    ) -> None:
        self.model, self.prophet, self.settings = model, prophet, settings
        self.tools, self.drafter = tools, drafter
        self.measured = measured  # SeProD's measured costs, saved after each question for the next process
        self.library = library if library is not None else load_library(settings.rationales)
        self.model_name = model_name or Path(model.path).name or "model"
        # the files loaded (model, mmproj, prophet, prophet_mmproj: paths, "" for none), which a chat records
        self.files = dict(files) if files is not None else _loaded_files(model, prophet)
        self.contexts = self._contexts(model, settings)
        # SSR's neutral scores (ssr_score pmi), computed once per model, system prompt and library: when a
        # system prompt is first evaluated or restored (the read-ahead's work while the person types)
        self.neutral = NeutralScores(model.identity, settings.home / NEUTRAL_FILE)
        self.contexts.on_system = self._prime_neutral
        self._wanted: list[str] = []  # the current question's SSR candidates, when they need neutral scores
        self._busy = threading.Lock()
        # the last few images asked about: a follow-up does not decode, resize and re-encode its photo
        self.images = ImageCache(model, self.model_name, lambda: self.settings.image_max_tokens)
        # read-ahead: the photo and the words typed, read into the chat's pending user turn meanwhile
        self._reader: Reader[AheadState] = Reader(self._read_ahead_step)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_settings(cls, settings: Settings, *, progress: Progress | None = None,
                      ahead: tuple[str, Images, str] | None = None) -> Engine:
        """Resolve and load the models named by ``settings`` (raises EdgeAgentError with the fix).
        ``ahead``: (question, image file(s), chat context key) of the question this engine is loaded for
        (``edge-agent ask``): read ahead as soon as the agent model is loaded (the system prompt's saved
        state, the photo's encode and decode), while the prophet loads."""
        from edge_agent.modelfiles.resolution import resolve
        from edge_agent.runtime import Model

        say = progress or (lambda msg, frac: None)
        check_n_ctx(settings)  # a config file edited by hand: n_ctx too small for the system prompt
        say("Finding the model", 0.0)
        library = load_library(settings.rationales)  # a bad library fails before minutes of loading
        resolved = resolve(settings)
        cls._check_prophet(settings, resolved)  # SeProD: a tokenizer mismatch fails before any load
        say(f"Loading {resolved.name}", 0.1)
        model = Model.from_settings(settings, resolved.model_path, resolved.mmproj_path,
                                    n_seq_max=max(8, len(library) + 1))
        try:
            from edge_agent.tools.search import SearchTools  # no network at construction (lazy session)

            tools = SearchTools.from_settings(settings)
        except BaseException:
            model.close()
            raise
        engine = cls(model, settings, tools=tools, library=library, model_name=resolved.name,
                     files=model_files(dataclasses.replace(resolved, prophet=None)))
        try:
            if ahead is not None:
                engine.read_ahead(ahead[0], ahead[1], context=ahead[2], whole=True)
            # the agent's threads change when the prophet shares the cores: not during a read-ahead step
            drafter, prophet = cls._load_drafter(settings, resolved, model, say, quiet=engine._reader.held)
        except BaseException:
            engine.close()
            raise
        if prophet is not None:
            from edge_agent.agent.seprod import Drafter as SeProDDrafter

            engine.drafter, engine.prophet, engine.files = drafter, prophet, model_files(resolved)
            if isinstance(drafter, SeProDDrafter):
                key = costs_key(model.identity, prophet.identity,
                                (model.n_threads, prophet.n_threads, settings.n_threads_batch))
                engine.measured = MeasuredCosts.open(settings.home, key, drafter.costs)
        say("Ready", 1.0)
        return engine

    @staticmethod
    def _check_prophet(settings: Settings, resolved: ResolvedModel) -> None:
        """SeProD compares token ids across the two models: refuse a prophet with another tokenizer
        (GGUF headers only, ~0.05 s) before either model is loaded."""
        prophet_files = resolved.prophet
        if prophet_files is None or not settings.seprod:
            return
        from edge_agent.modelfiles.checks import check_same_tokenizer, inspect

        check_same_tokenizer(inspect(resolved.model_path), inspect(prophet_files.model_path))

    @staticmethod
    def _load_drafter(settings: Settings, resolved: ResolvedModel, model: ModelLike, say: Progress, *,
                      quiet: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
                      ) -> tuple[DraftHooks | None, ModelLike | None]:
        """SeProD: the prophet model and its Drafter, when one is configured and seprod is on
        (the tokenizers were compared by ``_check_prophet`` before the agent loaded)."""
        prophet_files = resolved.prophet
        if prophet_files is None or not settings.seprod:
            say(f"Memory: {_memory_line(model)}", 0.9)
            return None, None
        from edge_agent.agent.seprod import Drafter
        from edge_agent.agent.seprod_policy import shared_threads
        from edge_agent.modelfiles import footprint
        from edge_agent.runtime import Model
        from edge_agent.runtime.cores import BACKGROUND, FOREGROUND, CoreShare, physical_cores

        say(f"Loading the prophet {prophet_files.name}", 0.6)
        # Threads: the prophet drafts while the agent decodes, so it gets the cores the agent's decoding
        # leaves free (1 on 2 cores), for its prefill too; the agent's decoding gives one up only where it
        # keeps 3 or more (seprod_policy.shared_threads); settings that name thread counts win.
        agent_n, n = shared_threads(max(1, model.n_threads), physical_cores())
        # n_seq_max=2: the prophet only drafts (seq 0); one spare seq keeps score() usable. Its context
        # holds one image, the query and a draft, never the chat: prophet_n_ctx cells, not n_ctx (a
        # Qwen3-VL-2B prophet's KV cache: 224 MiB in f16 at 2048 instead of 476 MiB in q8_0 at 8192).
        # The same mmproj file as the agent's: one vision tower in memory for both
        # (runtime.tower.VisionTower).
        prophet = Model.from_settings(settings, prophet_files.model_path, prophet_files.mmproj_path,
                                      n_seq_max=2,
                                      n_threads=settings.n_threads or n,
                                      n_threads_batch=settings.n_threads_batch or n,
                                      n_ctx=footprint.prophet_n_ctx(settings),
                                      share_vision_with=model if isinstance(model, Model) else None)
        try:
            # One machine, two models computing at once: the agent (whom the person waits for) never
            # waits and gets every core for its batched passes; the prophet computes beside it only
            # while they fit (runtime.cores: oversubscribed cores stall llama.cpp's spinning threads).
            cores = CoreShare(physical_cores())
            with quiet():
                model.share_cores(cores, FOREGROUND, n_threads=0 if settings.n_threads else agent_n)
            prophet.share_cores(cores, BACKGROUND)
            # decoding is memory-bound: the agent's time per token over the prophet's ~ their weight sizes
            sizes = (model.memory_bytes.get("model"), prophet.memory_bytes.get("model"))
            ratio = sizes[0] / sizes[1] if sizes[0] and sizes[1] else 1.0
            drafter = Drafter(prophet, agent_vocab=model.n_vocab, draft_len=settings.seprod_draft_len,
                              tau=settings.seprod_tau, a0=settings.seprod_a0,
                              adaptive=settings.seprod_adaptive,
                              agent_cost_ratio=ratio)
        except BaseException:
            prophet.close()
            raise
        say(f"Memory: agent {_memory_line(model)}; prophet {_memory_line(prophet)}", 0.9)
        return drafter, prophet

    @staticmethod
    def _contexts(model: ModelLike, settings: Settings) -> ChatContexts:
        """Chat contexts with a state store under ``home/states`` (``state_cache_mb`` 0: nothing saved)."""
        store = StateStore(settings.states_dir,
                           settings.state_cache_mb * 2**20) if settings.state_cache_mb > 0 else None
        # a question may need: each tool turn's action, rationale, crop and cut tool result, then the answer
        per_turn = max(settings.crop_max_tokens, 0) + max(settings.observation_max_tokens, 64) + 96
        reserve = settings.max_turns * per_turn + settings.answer_max_tokens + 64
        return ChatContexts(model, store, reserve=min(reserve, model.n_ctx // 2),
                            image_tokens=settings.image_max_tokens)

    def model_files(self) -> dict[str, str]:
        """The files loaded, by role: {"model": path, "mmproj": path, "prophet": ..., "prophet_mmproj": ...}
        (roles without a file left out); what an eval report names."""
        return {role: path for role, path in self.files.items() if path}

    def update_settings(self, new: Settings, changed: Collection[str]) -> bool:
        """Take new settings without loading anything (the app calls this between questions, on the UI
        thread): the next question's options come from ``new``; the search tools' ``offline`` and the
        SeProD drafter's tau and L_d follow. False, with nothing changed, when ``changed`` needs a new
        engine (:func:`needs_new_engine`)."""
        if needs_new_engine(self.settings, new, changed, drafter_loaded=self.drafter is not None):
            return False
        self.settings = new
        if self.tools is not None:
            self.tools.set_offline(new.offline)
        if self.drafter is not None:
            self.drafter.retune(tau=new.seprod_tau, draft_len=new.seprod_draft_len)
        return True

    def memory(self) -> dict[str, dict[str, int]]:
        """Bytes per loaded model (weights, KV cache, mmproj file), e.g. {"agent": {...}, "prophet":
        {...}}."""
        out = {"agent": dict(self.model.memory_bytes)}
        if self.prophet is not None:
            out["prophet"] = dict(self.prophet.memory_bytes)
        return out

    # ---- asking ---------------------------------------------------------------------------------
    def ask(self, request: AskRequest, *, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Answer one question (``AskRequest``: optionally about an image or several, continuing a chat's
        context). Yields the agent's events, ending with FinalAnswer, or AgentError(fatal=True) for a
        problem the user can fix (a bad image, an image for a text-only model, a full context)."""
        question, options = request.question, request.options
        history, context, seprod, seed = request.history, request.context, request.seprod, request.seed
        mode = request.mode or (options.mode if options else self.settings.mode)
        images = as_list(request.image)  # "" from a form field means no image
        label = images_label(images)
        try:
            if mode not in REASONING_MODES:
                raise ConfigError(f"Mode must be one of {', '.join(REASONING_MODES)}, not {mode!r}.")
            if not question or not question.strip():
                raise EdgeAgentError("The question is empty. Type a question.", title="Empty question")
            loaded = self.images.load_all(images)
            entries = _history_entries(history)
        except EdgeAgentError as e:
            yield RunStarted(question=question, image=label, mode=mode, seprod=False, model=self.model_name)
            yield AgentError(turn=0, title=e.title, message=e.message, fatal=True)
            return
        if not self._busy.acquire(blocking=False):
            raise EdgeAgentError("The engine is already answering a question. Wait for it or cancel it.",
                                 title="Busy")
        hold = contextlib.ExitStack()
        try:
            hold.enter_context(self._reader.paused())  # read-ahead stops; what it read is the question's
            if mode == "direct":
                events = self._direct(question, images, loaded, entries, context=context, cancel=cancel,
                                      options=options, seed=seed, label=label)
            else:
                events = self._agent(question, images, loaded, [(q, a) for q, a, _ in entries], mode=mode,
                                     context=context, cancel=cancel, seprod=seprod, options=options,
                                     seed=seed,
                                     label=label)
            try:  # model text leaves the engine without control characters (printed, stored, rendered)
                for event in events:
                    yield clean_event(event)
            finally:
                if isinstance(events, Generator):  # closed now, as `yield from` would (its cleanup runs)
                    events.close()
        finally:
            hold.close()
            self._busy.release()
            if self.measured is not None:
                self.measured.save()

    def _agent(self, question: str, images: list[ImageSource], loaded: list[LoadedImage],
               pairs: list[tuple[str, str]], *, mode: str, context: str | None,
               cancel: threading.Event | None,
               seprod: bool | None, options: AgentOptions | None, seed: int | None,
               label: str | None) -> Iterator[Event]:
        """The agent's turn loop (``agent.loop.run_agent``) on the chat's context, with the photos, crops."""
        store = None
        if loaded:
            run_dir = self.settings.crops_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            px = self.model.image_px_per_token or 32  # Qwen3-VL: 16 px patches, 2x2 merged
            pngs = [self.images.fitted(x, li) for x, li in zip(images, loaded, strict=True)]
            store = ImageStore(loaded[0].image, crops_dir=run_dir, max_pixels=self.images.budget(),
                               crop_max_pixels=self.settings.crop_max_tokens * px * px, original_png=pngs[0],
                               grid=px,
                               more=[(li.image, png) for li, png in zip(loaded[1:], pngs[1:], strict=True)])
        toolbox = Toolbox(store, self.tools, vision=self.model.has_vision)
        opts = options or AgentOptions.from_settings(self.settings, mode=mode, library=self.library)
        if opts.mode != mode:
            opts = _replace(opts, mode=mode)
        if seed is not None and seed != opts.seed:
            opts = _replace(opts, seed=seed)
        if not opts.model_name:
            opts = _replace(opts, model_name=self.model_name)
        self._wanted = []
        if opts.mode == "ssr" and opts.ssr_score == "pmi" and opts.neutral is None:
            opts = _replace(opts, neutral=self._neutral_row(toolbox, opts, continuing=bool(context)))
        use_drafter = self.drafter if (seprod if seprod is not None else self.settings.seprod) else None
        if use_drafter is not None:  # per-chat acceptance statistics start over with a new chat
            use_drafter.reset(new_chat=not context)
        pngs_in = [toolbox.image_png(i) for i in range(len(loaded))]
        image = (pngs_in[0] if len(pngs_in) == 1 else pngs_in) or None
        return run_agent(None, question, tools=toolbox, image=image,
                         options=opts, cancel=cancel, drafter=use_drafter, image_label=label,
                         context=self.contexts.question(context or "", pairs))

    def _direct(self, question: str, images: list[ImageSource], loaded: list[LoadedImage],
                entries: list[tuple[str, str, str | tuple[str, ...] | None]], *, context: str | None,
                cancel: threading.Event | None,
                options: AgentOptions | None, seed: int | None, label: str | None) -> Iterator[Event]:
        """The ``direct`` mode: the model alone in a plain chat (``agent.direct``), its prompt rendered by
        the model's own chat template; earlier exchanges carry the images they were asked with."""
        from edge_agent.agent.direct import Exchange, run_direct
        from edge_agent.runtime.chat_template import render

        opts = options or AgentOptions.from_settings(self.settings, mode="direct", library=self.library)
        opts = _replace(opts, mode="direct", model_name=opts.model_name or self.model_name,
                        seed=opts.seed if seed is None else seed)
        history = [Exchange(q, a, self._history_images(img)) for q, a, img in entries]
        pngs = tuple(self.images.fitted(x, li) for x, li in zip(images, loaded, strict=True))
        return run_direct(self.contexts.direct(context or "", bool(history)),
                          lambda msgs: render(self.model.chat_template, msgs), question, history=history,
                          images=pngs, options=opts, cancel=cancel, image_label=label)

    def _history_images(self, path: Images) -> tuple[bytes, ...]:
        """An earlier question's images as the model read them (none when one is gone or cannot be read)."""
        if not as_list(path) or not self.model.has_vision:
            return ()
        try:
            return tuple(self.images.pngs(as_list(path)))
        except EdgeAgentError:
            return ()

    def _neutral_row(self, toolbox: Toolbox, opts: AgentOptions, *, continuing: bool) -> dict[str, float]:
        """The neutral scores the question's candidates need (``calibration``): read by :meth:`_prime_neutral`
        when its context opens on the system prompt (a new chat: nothing else is evaluated or counted); a
        follow-up does not pass there, so its missing ones (a library this process has not scored) are
        read now, on the system prompt's session (the chat then continues from its saved state)."""
        system = system_for(toolbox, opts)
        self._wanted = [index_label(k) if opts.index_only else r.text for k, r in enumerate(opts.library)]
        if continuing and self.neutral.missing(system, self._wanted):
            s, _key, _how = self.contexts.system_session(system)  # -> _prime_neutral
        return self.neutral.row(system)

    def _prime_neutral(self, s: Any, system: str) -> None:
        """``ChatContexts.on_system``: the neutral scores after ``system`` of the settings' library and of the
        question's candidates, on the session holding exactly it, unless known (then nothing is evaluated)."""
        lib = self.library
        texts = [*self._wanted, *(r.text for r in lib)]
        if self.settings.ssr_index_only:
            texts += [index_label(k) for k in range(len(lib))]
        if self.settings.ssr_score != "pmi" and not self._wanted:
            return
        if missing := self.neutral.missing(system, texts):
            self.contexts.to_boundary(s)
            self.neutral.add(system, missing, neutral_means(s, missing))


    # ---- read-ahead ------------------------------------------------------------------------------
    def read_ahead(self, text: str = "", image: Images = None, *, context: str = "",
                   whole: bool = False) -> None:
        """What the person has given so far for the next question of the chat ``context`` ('' a new chat):
        the attached ``image`` file (a list: several; None: none) and the ``text`` typed. Read in the
        background into the chat's pending user turn: the photos at once, the text's whole words after a
        short quiet (unless
        the ``type_ahead`` setting is off). Returns at once (the app calls it on attach, detach and every
        change of the prompt). The question then keeps what still matches and evaluates only the rest;
        nothing read ahead is ever saved as part of the chat. ``whole``: ``text`` is the question as it
        will be sent (``ask``): all of it is read, with the end of its turn."""
        words, closed = stable_prefix(text) if self.settings.type_ahead else ("", False)
        if whole:
            words, closed = text.strip(), True
        self._reader.want(Target(context or "", tuple(str(x) for x in as_list(image)), words, closed))

    def read_ahead_idle(self, timeout: float = 10.0) -> bool:
        """Wait until what was asked for is read ahead (tests, benchmarks); False on timeout."""
        return self._reader.idle(timeout)

    def stop_read_ahead(self) -> None:
        """Stop the read-ahead worker for good (``close`` does it too; benchmarks that keep the model)."""
        self._reader.close()

    def drop_read_ahead(self) -> None:
        """Roll back whatever was read ahead (a new chat, leaving a chat): the chat's context as it was."""
        with self._reader.paused():
            self.contexts.drop_ahead()

    @property
    def ahead(self) -> AheadState | None:
        """What is read ahead now (None: nothing)."""
        return self._reader.state

    def _read_ahead_step(self, target: Target, stop: threading.Event) -> AheadState | None:
        pngs = self.images.pngs(target.images)  # ImageError on a text-only model: the question says so
        if self.settings.mode == "direct":  # a plain chat reads its prompt whole at Enter; the encodes now
            for png in pngs:
                self.model.encode_image(png)
            return None
        options = AgentOptions.from_settings(self.settings, mode=self.settings.mode, library=self.library)
        system = system_for(Toolbox(None, self.tools, vision=self.model.has_vision), options)
        return self.contexts.read_ahead(system, target.context, (pngs[0] if len(pngs) == 1 else pngs) or None,
                                        target.text, closed=target.closed, cancel=stop)


    def prepare_image(self, image: str | Path) -> bool:
        """Read an attached image before its question comes (the app calls this, in a worker thread,
        while the person types): the photo is loaded and fitted as ``ask`` will fit it, and the agent's
        vision projector encodes it into the shared embedding cache. The question then decodes the
        embedding instead of waiting for the encode (its ImageEvaluated says ``reused``). True when the
        image was encoded now; False when there was nothing to do (cached already, a text-only model, a
        file that cannot be read: ``ask`` reports that). Beside a running ``ask`` it is safe: whichever
        needs the encode first does it, the other waits for it."""
        return self.images.prepare(image)

    def settle(self) -> None:
        self.contexts.flush()  # saved states still being written

    def close(self) -> None:
        self._reader.close()  # nothing read ahead is saved: the pending turn dies with the context
        self.contexts.flush()  # saved states still being written
        if self.drafter is not None:
            self.drafter.close()
        if self.tools is not None:
            self.tools.close()
        if self.prophet is not None:
            self.prophet.close()
        self.model.close()
        self.contexts.live = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _memory_line(model: ModelLike) -> str:
    """``model 94 MB + KV 64 MB + mmproj 0 MB = 158 MB`` from ``Model.memory_bytes``."""
    mem = dict(model.memory_bytes)
    if not mem:
        return "unknown"
    shared = model.has_vision and mem.get("mmproj") == 0  # the projector is another model's (counted there)
    parts = " + ".join(f"{'KV' if k == 'kv_cache' else k} {v / 2**20:.0f} MB" for k, v in mem.items()
                       if not (shared and k == "mmproj"))
    return f"{parts} = {sum(mem.values()) / 2**20:.0f} MB" + ("; vision tower shared" if shared else "")


def _replace(opts: AgentOptions, **kw: Any) -> AgentOptions:
    import dataclasses

    return dataclasses.replace(opts, **kw)


def _history_entries(history: Sequence[Any] | None) -> list[tuple[str, str, str | tuple[str, ...] | None]]:
    """Earlier exchanges as (question, answer, image file, a tuple of files for several, or None): (question,
    answer) or (question, answer, image) tuples/lists, or dicts with those keys (``image`` optional)."""
    out: list[tuple[str, str, str | tuple[str, ...] | None]] = []
    for h in history or ():
        if isinstance(h, dict):
            q, a, img = h.get("question"), h.get("answer"), h.get("image")
        elif isinstance(h, tuple | list) and len(h) in (2, 3):
            q, a, img = (*h, None)[:3]
        else:
            raise ConfigError(f"History entries must be (question, answer) pairs, not {type(h).__name__}.")
        if q and a:
            paths = tuple(str(x) for x in img) if isinstance(img, tuple | list) else (str(img),) * bool(img)
            out.append((str(q), str(a), paths[0] if len(paths) == 1 else (paths or None)))
    return out


def _conforms(engine: Engine) -> EngineFace:
    """mypy holds ``Engine`` to its face, what the app, ask, the eval and the cluster use (never called)."""
    return engine
