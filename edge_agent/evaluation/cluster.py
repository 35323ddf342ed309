"""`edge-agent eval --cluster ray`: the questions of an eval run on the workers of a Ray cluster.

Ray does the distributed part: it places one actor per worker (``--threads-per-worker`` reserved as
its CPUs), restarts an actor whose process dies (``max_restarts``) and retries the question it was
running (``max_task_retries``). Each actor holds one loaded Engine (the models load once per worker)
and answers through :func:`edge_agent.evaluation.run_question`, the code path of a local eval; each
question's seed comes from its id, so a cluster run answers as a local run does. This module only
connects, hands each idle worker the next question, and brings back what the workers produced:

- records, streamed to the driver's resumable ``results.jsonl`` by the runner as they arrive;
- the searches a worker fetched live, merged into the driver's search cache (so a rerun with
  ``--offline`` reproduces the run). The driver's cache goes the other way through Ray's object
  store: every worker starts from a private copy of it, so ``--offline`` works on any node;
- which files each worker loaded (a catalog name is pulled once per node, under a node-wide lock;
  a path must exist on every node, checked before any question starts: the error names the node).

Ray is optional (``pip install 'edge-agent[cluster]'``) and imported only here, only when used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edge_agent.core.config import Settings
from edge_agent.core.errors import ConfigError, EdgeAgentError, ModelFileError
from edge_agent.engine.face import EngineFace
from edge_agent.evaluation import AskFn, Question, default_ask, make_record, run_question
from edge_agent.evaluation.modes import ModeSpec
from edge_agent.evaluation.runner import Work
from edge_agent.modelfiles.catalog import CatalogEntry
from edge_agent.tools.cache import CacheEntry, SearchCache

TASK_RETRIES = 2  # a question whose worker dies is run again this many times, then recorded as an error
INSTALL = "pip install 'edge-agent[cluster]'"
NODE_CHECK_S = 2.0  # how often the driver asks Ray whether the workers' nodes are still alive


class ClusterLost(EdgeAgentError):
    """Ray lost a node the workers ran on: the run stops; what finished is kept (the runner stored it)."""

    title = "Ray lost a node"


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError that says which command installs it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"--cluster needs Ray, which is not installed. Install the cluster extra: `{INSTALL}` "
            f"(from a checkout: `.venv/bin/pip install -e '.[cluster]'`; for this Python exactly: "
            f"`{sys.executable} -m pip install 'ray>=2.40,<3'`).", title="Ray not installed") from None
    return ray


def parse_cluster(text: str) -> str | None:
    """``ray`` -> None (``RAY_ADDRESS`` or a new local cluster); ``ray:ADDRESS`` -> ADDRESS."""
    kind, _, address = text.partition(":")
    if kind.strip().lower() != "ray":
        raise ConfigError(f"--cluster takes `ray` or `ray:ADDRESS` (e.g. ray:10.0.0.5:6379), not {text!r}.")
    return address.strip() or None


def worker_settings(settings: Settings, threads: int) -> dict[str, Any]:
    """What a worker's Settings take from the driver's: everything but ``home`` (a node keeps its own
    models, states and crops), paths made absolute (a relative path means the driver's folder), and
    ``threads`` for llama.cpp (the CPUs Ray reserved for the worker)."""
    out = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name != "home"}
    for key in ("model", "mmproj", "prophet", "prophet_mmproj", "rationales"):
        value = out[key]
        if value and Path(value).expanduser().exists():
            out[key] = str(Path(value).expanduser().resolve())
    out.update(n_threads=threads, n_threads_batch=threads)
    return out


class _RecordingCache(SearchCache):
    """A worker's private search cache: it remembers the entries its live searches write."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fetched: list[CacheEntry] = []

    def put_many(self, entries: Any, keep_newer: bool = False) -> int:
        entries = list(entries)
        self.fetched += entries
        return super().put_many(entries, keep_newer)


class EvalWorker:
    """One Ray actor (one worker process): one Engine, loaded by ``prepare`` or the first question.
    Ray restarts it after its process dies (``__init__`` runs again, the models load again)."""

    def __init__(self, fields: dict[str, Any], ask: AskFn, pulls: list[CatalogEntry]) -> None:
        self.settings = dataclasses.replace(Settings.load(), **fields)
        self.ask, self.pulls = ask, pulls
        self.engine: EngineFace | None = None
        self.tmp = _worker_tmp()
        self.cache = _RecordingCache(self.tmp / "search-cache.sqlite3")
        self.cache_loaded = False
        self.node = _node_label()
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()

    def prepare(self, shipped: dict[str, Any]) -> dict[str, Any]:
        """Fill the private search cache from the driver's (``shipped["cache"]``: a reference into the object
        store, passed with every call, so a restarted worker fills it again), pull catalog models this node
        lacks, load the Engine. Returns {"node", "pid", "files"} or {"node", "pid", "error"}."""
        if not self.cache_loaded:
            import ray

            entries = ray.get(shipped["cache"])
            if entries:
                self.cache.put_many(entries)
            self.cache.fetched, self.cache_loaded = [], True
        if self.engine is None:
            try:
                _pull_missing(self.settings, self.pulls)
                from edge_agent.engine.engine import Engine  # heavy: llama.cpp

                engine = Engine.from_settings(self.settings)
            except EdgeAgentError as e:
                return {"node": self.node, "pid": os.getpid(), "error": e.message}
            if engine.tools is not None and hasattr(engine.tools, "cache"):
                engine.tools.cache = self.cache  # searches read the shipped copy; live ones are recorded
            self.engine = engine
        return {"node": self.node, "node_id": self.node_id, "pid": os.getpid(),
                "files": self.engine.model_files()}

    def run(self, q: Question, modes: list[ModeSpec], shipped: dict[str, Any]) -> dict[str, Any]:
        """Question ``q`` in each of ``modes``: its records, the search entries fetched live for it, and
        which process ran it (a changed pid tells the driver Ray restarted this worker)."""
        ready = self.prepare(shipped)
        if "error" in ready:
            raise ModelFileError(f"On node {self.node}: {ready['error']}")
        self.cache.fetched = []
        assert self.engine is not None  # prepared above
        records = list(run_question(self.engine, q, modes, self.ask))
        return {"records": records, "entries": self.cache.fetched, "pid": os.getpid()}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        shutil.rmtree(self.tmp, ignore_errors=True)


def _worker_tmp() -> Path:
    """This worker's own folder (its search cache), ``edge-agent-worker-<pid>`` in the node's temp folder.
    Folders of workers that died without ``close`` (killed) are removed here, by the next worker."""
    base = Path(tempfile.gettempdir())
    for old in base.glob("edge-agent-worker-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    path = base / f"edge-agent-worker-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _node_label() -> str:
    """``host (10.0.0.5, node 63ca82)``: the machine, and which Ray node on it (a machine may run several)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    return f"{socket.gethostname()} ({ray.util.get_node_ip_address()}, node {node_id[:6]})"


def _pull_missing(settings: Settings, entries: list[CatalogEntry]) -> None:
    """Download the catalog models (agent, prophet) this node lacks, once per node: the node's workers
    take a lock on its models folder in turn, and the later ones find the files there."""
    from edge_agent.modelfiles import pull as model_pull
    from edge_agent.modelfiles.registry import Registry

    if not entries:
        return
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.models_dir / ".cluster-pull.lock", "a+") as lock:
        with contextlib.suppress(ImportError):
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes or the process dies
        for entry in entries:
            installed = Registry(settings.models_dir).get(entry.name)
            if installed is None or installed.missing_files():
                model_pull.pull(entry, settings)


def catalog_pulls(settings: Settings) -> list[CatalogEntry]:
    """The models named by the driver's catalog (not installed-only names, not the demo, not paths): the
    workers pull these entries, so every node downloads what the driver's catalog says."""
    from edge_agent.modelfiles.catalog import load_catalog
    from edge_agent.modelfiles.registry import Registry

    catalog, registry = load_catalog(), Registry(settings.models_dir)
    out = []
    for name in (settings.model, settings.prophet):
        entry = catalog.get(name) if name else None
        installed = registry.get(name) if name else None
        if entry is not None and not entry.is_demo and entry.wheels is None and (
                installed is None or installed.source == "pull"):
            out.append(entry)
    return out


class RayWorkers:
    """The runner's ``workers`` for a Ray cluster (see ``evaluation.runner.Workers``).

    ``address``: None connects to ``RAY_ADDRESS`` when set, else starts a local cluster sized to this
    machine (and stops it at the end). ``workers`` None: as many as the cluster's CPUs allow."""

    def __init__(self, settings: Settings, *, address: str | None = None, workers: int | None = None,
                 threads: int = 1, gpus: float = 0.0, ask: AskFn = default_ask) -> None:
        self.ray = import_ray()
        self.settings, self.address, self.want, self.threads, self.gpus = (
            settings, address, workers, threads, gpus)
        self.ask = ask
        self.model_files: dict[str, str] = {}
        self.stats: list[dict[str, Any]] = []  # per worker: node, pid, done, restarts, busy
        self.nodes: list[str] = []
        self.shipped: dict[str, Any] = {}
        self.ready_at = 0.0
        self._lock = threading.Lock()

    # ---- what the progress line and the report show ------------------------------------------------
    def info(self) -> dict[str, Any]:
        with self._lock:
            per = [{k: w[k] for k in ("node", "done", "restarts")} for w in self.stats]
        return {"engine": "ray", "address": self.address or os.environ.get("RAY_ADDRESS") or "local",
                "workers": len(per), "threads_per_worker": self.threads, "gpus_per_worker": self.gpus,
                "nodes": sorted(set(self.nodes)), "per_worker": per}

    def busy_pids(self) -> list[int]:
        """Processes now running a question (tests kill one)."""
        with self._lock:
            return [w["pid"] for w in self.stats if w["busy"]]

    # ---- the run ------------------------------------------------------------------------------------
    def run(self, work: Work, cancel: threading.Event | None) -> Iterator[list[dict[str, Any]]]:
        if not work:
            return
        ray = self.ray
        started = self._connect()
        actors: list[Any] = []
        try:
            actors = self._start(ray)
            yield from self._dispatch(ray, actors, work, cancel)
        finally:
            self._stop(ray, actors, started)

    def _connect(self) -> bool:
        """Connect (True: this run started Ray in-process, and shuts it down at the end)."""
        ray = self.ray
        if ray.is_initialized():
            return False
        # Quiet: the workers' llama.cpp logs stay in Ray's log files; errors come back as exceptions.
        kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        try:
            if self.address:
                ray.init(address=self.address, **kw)
            elif os.environ.get("RAY_ADDRESS"):
                ray.init(**kw)
            else:  # one CPU per physical core: hyper-threads do not speed up llama.cpp
                from edge_agent.runtime.cores import physical_cores

                ray.init(num_cpus=physical_cores(), **kw)
        except ConnectionError as e:
            auth = "" if os.environ.get("RAY_AUTH_MODE") else (
                " If it is running, it may want its token: `export RAY_AUTH_MODE=token` (Ray reads the token "
                "from ~/.ray/auth_token, which must be the head's) and run this again.")
            raise ConfigError(f"Cannot connect to the Ray cluster at "
                              f"{self.address or os.environ.get('RAY_ADDRESS')} ({e}). Start it with `ray "
                              f"start --head` (see the README) or check the address.{auth}",
                              title="No Ray cluster") from None
        return True

    def _start(self, ray: Any) -> list[Any]:
        """One actor per worker; every one loads its models before any question is sent."""
        cpus = int(ray.cluster_resources().get("CPU", 0))
        n = self.want or max(1, cpus // self.threads)
        if n * self.threads > cpus:
            raise ConfigError(f"The cluster has {cpus} CPUs; {n} workers x {self.threads} threads need "
                              f"{n * self.threads}. "
                              "Pass fewer --workers or --threads-per-worker, or join more nodes.")
        cache = (list(SearchCache(self.settings.cache_path).entries()) if self.settings.cache_path.exists()
                 else [])
        remote = ray.remote(EvalWorker).options(num_cpus=self.threads, num_gpus=self.gpus or None,
                                                max_restarts=-1,
                                                max_task_retries=TASK_RETRIES)
        # Once into the object store, read once by each worker process. Nested in a dict, so each call
        # carries only the reference (a constructor argument in the object store would warn on every start).
        self.shipped = {"cache": ray.put(cache)}
        fields = worker_settings(self.settings, self.threads)
        actors = [remote.remote(fields, self.ask, catalog_pulls(self.settings)) for _ in range(n)]
        ready = ray.get([a.prepare.remote(self.shipped) for a in actors])
        errors = sorted({f"On node {r['node']}: {r['error']}" for r in ready if "error" in r})
        if errors:
            self._stop(ray, actors, False)
            raise ModelFileError(" ".join(errors) + " Every node that runs workers needs the model files: a "
                                 "path must exist on each (a shared file system), a catalog name is pulled "
                                 "on each.",
                                 title="Models not ready on a worker")
        # every worker has its models loaded (the benchmark times from here)
        self.ready_at = time.perf_counter()
        self.model_files = dict(ready[0]["files"])
        self.nodes = [r["node"] for r in ready]
        self.stats = [{"node": r["node"], "node_id": r.get("node_id", ""), "pid": r["pid"], "done": 0,
                       "restarts": 0,
                       "busy": False} for r in ready]
        return actors

    def lost_nodes(self) -> list[str]:
        """The workers' nodes Ray reports dead (their labels); [] while all live (or Ray cannot say)."""
        try:
            dead = {n.get("NodeID") for n in self.ray.nodes() if not n.get("Alive", True)}
        except Exception:  # noqa: BLE001 - the GCS itself gone: the next call on a worker says so
            return []
        with self._lock:
            return sorted({w["node"] for w in self.stats if w.get("node_id") in dead})

    def _check_nodes(self, running: int) -> None:
        """Stop the run when a node the workers ran on is lost: say which, and that a rerun resumes (the
        questions it was running are not recorded, so the rerun asks them; the finished ones are kept)."""
        lost = self.lost_nodes()
        if lost:
            raise ClusterLost(
                f"Ray lost {'the node' if len(lost) == 1 else 'the nodes'} {', '.join(lost)} (marked dead: "
                f"its raylet, or an agent of it, stopped); {running} question(s) running there were not "
                f"finished.")

    def _dispatch(self, ray: Any, actors: list[Any], work: Work,
                  cancel: threading.Event | None) -> Iterator[list[dict[str, Any]]]:
        """Each idle worker gets the next question; results are yielded as they arrive (any order)."""
        todo = list(work)
        running: dict[Any, tuple[int, Question, list[ModeSpec]]] = {}
        idle = list(range(len(actors)))
        checked = time.monotonic()
        while todo or running:
            if time.monotonic() - checked > NODE_CHECK_S:
                self._check_nodes(len(running))
                checked = time.monotonic()
            while idle and todo and not (cancel is not None and cancel.is_set()):
                i = idle.pop(0)
                q, modes = todo.pop(0)
                running[actors[i].run.remote(q, modes, self.shipped)] = (i, q, modes)
                self._set(i, busy=True)
            if not running:
                return
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in ready:
                i, q, modes = running.pop(ref)
                idle.append(i)
                self._set(i, busy=False)
                yield self._collect(ray, ref, i, q, modes, len(running) + 1)

    def _collect(self, ray: Any, ref: Any, i: int, q: Question, modes: list[ModeSpec],
                 running: int = 1) -> list[dict[str, Any]]:
        try:
            out = ray.get(ref)
        except ray.exceptions.RayActorError as e:  # the process died on every try: the question's result
            self._check_nodes(running)  # ...unless its node is gone: then nothing of it is recorded
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            error = (f"Worker process died {TASK_RETRIES + 1} times running this question "
                     f"({type(e).__name__}: {reason}). Rerun the same command to try it again.")
            return [make_record(q, m, [], wall_seconds=None, error=error) for m in modes]
        except ray.exceptions.RayTaskError as e:  # a bug (or a user error) raised in the worker: as locally
            raise e.as_instanceof_cause() from None
        if out["entries"]:  # what the worker fetched live: the driver's cache keeps it for --offline reruns
            SearchCache(self.settings.cache_path).put_many(out["entries"], keep_newer=True)
        with self._lock:
            w = self.stats[i]
            if out["pid"] != w["pid"]:
                w["pid"], w["restarts"] = out["pid"], w["restarts"] + 1
            w["done"] += len(out["records"])
        return list(out["records"])

    def _set(self, i: int, **kw: Any) -> None:
        with self._lock:
            if i < len(self.stats):
                self.stats[i].update(kw)

    def _stop(self, ray: Any, actors: list[Any], started: bool) -> None:
        """Close the workers (engines, temp caches), end their processes, and stop a cluster we started."""
        try:
            with contextlib.suppress(ray.exceptions.RayError):  # a worker that is gone needs no closing
                ray.get([a.close.remote() for a in actors], timeout=30)
            for a in actors:
                ray.kill(a)
            self.shipped = {}
        finally:
            if started:
                ray.shutdown()

