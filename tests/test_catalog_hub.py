"""Downloads against a real HTTP server on 127.0.0.1 that speaks the hub's API (tests/fakes/hub.py)."""

from __future__ import annotations

import hashlib
import os

import pytest

from edge_agent.core.config import Settings
from edge_agent.core.errors import DownloadError
from edge_agent.modelfiles.catalog import CatalogEntry, CatalogFile, load_catalog, repo_dirname
from edge_agent.modelfiles.hub import HubClient
from edge_agent.modelfiles.overview import overview
from edge_agent.modelfiles.pull import check_disk, pull
from edge_agent.modelfiles.registry import Registry
from tests.fakes.hub import FakeHub

REPO = "Test/Tiny-VL-GGUF"
MODEL = bytes(range(256)) * 1200  # 300 kB: several 64 kB reads, cut points land mid-file
MMPROJ = b"mmproj" * 20000


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EDGE_AGENT_MODELS_DIR", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return Settings.load(env={"EDGE_AGENT_HOME": str(tmp_path / "home")})


@pytest.fixture
def hub(monkeypatch):
    with FakeHub() as h:
        h.add_file(REPO, "tiny-Q4_K_M.gguf", MODEL)
        h.add_file(REPO, "mmproj-tiny-F16.gguf", MMPROJ)
        h.add_file(REPO, "README.md", b"# tiny\n", lfs=False)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


def entry(**kw) -> CatalogEntry:
    d = dict(name="tiny-vl", description="tiny test model", family="tiny", params="1M", variant="instruct",
             quant="Q4_K_M", architecture="qwen3vl", roles=("agent",), tokenizer="qwen3", source="official",
             repo=REPO, file=CatalogFile("tiny-Q4_K_M.gguf", len(MODEL)),
             mmproj=CatalogFile("mmproj-tiny-F16.gguf", len(MMPROJ)))
    d.update(kw)
    return CatalogEntry(**d)


def pull_bytes(*a, **kw):
    """The transfer tests serve random bytes: skip the GGUF header check (tested below and in
    test_models_cli)."""
    kw.setdefault("check", False)
    return pull(*a, **kw)


def client(**kw) -> HubClient:
    kw.setdefault("backoff", 0.0)
    return HubClient(**kw)


def test_pull_downloads_verifies_and_registers(settings, hub):
    """A pull puts both files under models_dir/<owner>--<repo>/, byte-exact, and registers the model."""
    m = pull_bytes(entry(), settings, client=client())
    folder = settings.models_dir / repo_dirname(REPO)
    assert (folder / "tiny-Q4_K_M.gguf").read_bytes() == MODEL
    assert (folder / "mmproj-tiny-F16.gguf").read_bytes() == MMPROJ
    assert not list(folder.glob("*.part"))
    reg = Registry(settings.models_dir)
    assert reg.get("tiny-vl").path == m.path == str(folder / "tiny-Q4_K_M.gguf")
    assert reg.get("tiny-vl").sha256 == hashlib.sha256(MODEL).hexdigest()
    # the hashes' commit is pinned in the transfer URL, not 'main'
    assert any("/resolve/0123456789abcdef" in p for _, p, _, _ in hub.requests)


def test_interrupted_transfer_resumes_with_range(settings, hub):
    """A connection cut mid-file is retried from the byte where it stopped (Range), and the file is exact."""
    hub.cut_after["tiny-Q4_K_M.gguf"] = 100_000
    pull_bytes(entry(), settings, client=client())
    assert hub.transfers("tiny-Q4_K_M.gguf") == [None, "bytes=100000-"]
    assert (settings.models_dir / repo_dirname(REPO) / "tiny-Q4_K_M.gguf").read_bytes() == MODEL


def test_failed_pull_leaves_part_not_installed_and_next_pull_resumes(settings, hub):
    """With retries exhausted, the pull fails, the model is not installed, and the next pull resumes."""
    hub.cut_after["tiny-Q4_K_M.gguf"] = 70_000
    with pytest.raises(DownloadError, match="Run the same command again to resume"):
        pull_bytes(entry(), settings, client=client(retries=0))
    folder = settings.models_dir / repo_dirname(REPO)
    assert (folder / "tiny-Q4_K_M.gguf.part").stat().st_size == 70_000
    assert not (folder / "tiny-Q4_K_M.gguf").exists()
    assert Registry(settings.models_dir).get("tiny-vl") is None
    # a partial download is shown as such, never as installed
    shipped = overview(settings)
    # the model cache, not this home
    machine_wide = {e.name for e in load_catalog().entries if e.wheels is not None}
    assert all(r.status != "installed" for r in shipped if r.name not in machine_wide)

    pull_bytes(entry(), settings, client=client(retries=0))
    assert hub.transfers("tiny-Q4_K_M.gguf") == [None, "bytes=70000-"]
    assert (folder / "tiny-Q4_K_M.gguf").read_bytes() == MODEL
    assert Registry(settings.models_dir).get("tiny-vl") is not None


def test_resume_from_a_previous_process_hashes_the_existing_part(settings, hub):
    """A .part left by an earlier run (different process) is verified as a whole after resuming."""
    folder = settings.models_dir / repo_dirname(REPO)
    folder.mkdir(parents=True)
    (folder / "tiny-Q4_K_M.gguf.part").write_bytes(MODEL[:12345])
    pull_bytes(entry(), settings, client=client())
    assert hub.transfers("tiny-Q4_K_M.gguf") == ["bytes=12345-"]
    assert (folder / "tiny-Q4_K_M.gguf").read_bytes() == MODEL


def test_a_wrong_part_fails_the_checksum_and_is_deleted(settings, hub):
    """A .part whose bytes are not the file's prefix gives a checksum error, and is removed (not resumed
    again)."""
    folder = settings.models_dir / repo_dirname(REPO)
    folder.mkdir(parents=True)
    (folder / "tiny-Q4_K_M.gguf.part").write_bytes(b"\0" * 5000)
    with pytest.raises(DownloadError, match="corrupt"):
        pull_bytes(entry(), settings, client=client())
    assert not (folder / "tiny-Q4_K_M.gguf.part").exists()
    assert not (folder / "tiny-Q4_K_M.gguf").exists()
    pull_bytes(entry(), settings, client=client())  # the next try starts clean and succeeds
    assert (folder / "tiny-Q4_K_M.gguf").read_bytes() == MODEL


def test_corrupted_file_fails_checksum_and_is_not_installed(settings, hub):
    """Bytes that do not match the hub's sha256 never get the final name and never reach the registry."""
    hub.corrupt.add("mmproj-tiny-F16.gguf")
    with pytest.raises(DownloadError) as e:
        pull_bytes(entry(), settings, client=client())
    assert e.value.title == "Checksum mismatch"
    assert hashlib.sha256(MMPROJ).hexdigest() in e.value.message
    folder = settings.models_dir / repo_dirname(REPO)
    assert not (folder / "mmproj-tiny-F16.gguf").exists()
    assert not (folder / "mmproj-tiny-F16.gguf.part").exists()
    assert not (folder / "mmproj-tiny-F16.gguf.part.lock").exists()
    assert Registry(settings.models_dir).get("tiny-vl") is None


def test_server_ignoring_range_restarts_cleanly(settings, hub):
    """A server that answers a Range request with the whole file (200) must not leave duplicated bytes."""
    folder = settings.models_dir / repo_dirname(REPO)
    folder.mkdir(parents=True)
    (folder / "tiny-Q4_K_M.gguf.part").write_bytes(MODEL[:5000])
    hub.ignore_range = True
    pull_bytes(entry(), settings, client=client())
    assert (folder / "tiny-Q4_K_M.gguf").read_bytes() == MODEL


def test_shared_mmproj_is_not_downloaded_twice(settings, hub):
    """Two quantizations of one repo share the mmproj file: the second pull reuses it."""
    hub.add_file(REPO, "tiny-Q8_0.gguf", MODEL[::-1])
    pull_bytes(entry(), settings, client=client())
    pull_bytes(entry(name="tiny-vl-q8_0", quant="Q8_0", file=CatalogFile("tiny-Q8_0.gguf")), settings,
               client=client())
    assert len(hub.transfers("mmproj-tiny-F16.gguf")) == 1
    assert {m.name for m in Registry(settings.models_dir).models} == {"tiny-vl", "tiny-vl-q8_0"}


def test_already_installed_is_a_no_op(settings, hub):
    pull_bytes(entry(), settings, client=client())
    n = len(hub.requests)
    msgs = []
    pull_bytes(entry(), settings, client=client(), notify=msgs.append)
    assert len(hub.requests) == n and "already installed" in msgs[0]


def test_missing_file_repo_and_gated_give_clear_errors(settings, hub, monkeypatch):
    with pytest.raises(DownloadError, match="has no file nope.gguf"):
        pull_bytes(entry(file=CatalogFile("nope.gguf")), settings, client=client())
    with pytest.raises(DownloadError, match="no such repository"):
        pull_bytes(entry(repo="Nobody/Nothing"), settings, client=client())
    hub.gated.add(REPO)
    with pytest.raises(DownloadError, match="HF_TOKEN"):
        pull_bytes(entry(), settings, client=client())
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    pull_bytes(entry(), settings, client=client())
    assert hub.requests[-1][3] == "Bearer hf_test_token"


def test_busy_hub_file_list_is_retried_then_reported(settings, hub):
    """The file list shares the download's retry loop: 503s are retried; with no retry left the error says
    so."""
    hub.api_busy = 2
    pull_bytes(entry(), settings, client=client(retries=2))
    assert [p for m, p, _, _ in hub.requests
            if p.startswith("/api/")] == [f"/api/models/{REPO}/revision/main"] * 3
    hub.api_busy = 1
    with pytest.raises(DownloadError, match="answered HTTP 503"):
        pull_bytes(entry(), settings, client=client(retries=0), force=True)


def test_offline_and_unreachable(settings, hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE"):
        pull_bytes(entry(), settings, client=client())
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(DownloadError, match="Could not reach"):
        pull_bytes(entry(), settings, client=client(endpoint="http://127.0.0.1:9", timeout=2))


def test_free_disk_check_runs_before_any_transfer(settings, hub, monkeypatch):
    """When the disk is too small, nothing is downloaded and the error says how much is needed."""
    import shutil as _shutil

    real = _shutil.disk_usage
    monkeypatch.setattr("edge_agent.modelfiles.pull.shutil.disk_usage",
                        lambda p: real(p)._replace(free=len(MODEL) // 2))
    with pytest.raises(DownloadError, match="Not enough disk space"):
        pull_bytes(entry(), settings, client=client())
    assert hub.transfers("tiny-Q4_K_M.gguf") == []


def test_check_disk_probes_the_nearest_existing_folder(tmp_path):
    check_disk(tmp_path / "not" / "yet", 1000)
    with pytest.raises(DownloadError, match="EDGE_AGENT_MODELS_DIR"):
        check_disk(tmp_path / "not" / "yet", 1 << 60)


def test_small_non_lfs_file_is_verified_by_git_oid(settings, hub, tmp_path):
    """Files the hub lists only by git blob id are checked against it."""
    c = client()
    f = c.repo_files(REPO)["README.md"]
    assert f.sha256 is None and f.git_oid
    dest = c.download(f, tmp_path / "README.md")
    assert dest.read_bytes() == b"# tiny\n"
    hub.corrupt.add("README.md")
    with pytest.raises(DownloadError, match="git blob id"):
        c.download(f, tmp_path / "README2.md")


def test_progress_reports_resume_offset_and_total(settings, hub):
    folder = settings.models_dir / repo_dirname(REPO)
    folder.mkdir(parents=True)
    (folder / "tiny-Q4_K_M.gguf.part").write_bytes(MODEL[:1000])
    seen = []

    class P:
        def start(self, label, total, done):
            seen.append(("start", label, total, done))

        def advance(self, done):
            seen.append(("advance", done))

        def finish(self):
            seen.append(("finish",))

    pull_bytes(entry(), settings, client=client(), progress=P())
    assert seen[0] == ("start", "tiny-Q4_K_M.gguf", len(MODEL), 1000)
    second = seen.index(("finish",)) + 1
    assert seen[second] == ("start", "mmproj-tiny-F16.gguf", len(MMPROJ), 0)
    for part, total in ((seen[1:second - 1], len(MODEL)), (seen[second + 1:-1], len(MMPROJ))):
        done = [s[1] for s in part]
        assert done == sorted(done) and done[-1] == total
    assert seen.count(("finish",)) == 2
    assert os.path.exists(folder / "mmproj-tiny-F16.gguf")


def test_pulled_files_that_are_not_a_working_pair_are_not_installed(settings, hub):
    """Checksums match but the GGUF headers are wrong (here: not GGUF at all): nothing is registered."""
    from edge_agent.core.errors import ModelFileError

    with pytest.raises(ModelFileError, match="was not installed"):
        pull(entry(), settings, client=client())
    assert Registry(settings.models_dir).get("tiny-vl") is None


def test_a_second_concurrent_download_of_the_same_file_is_refused(settings, hub, tmp_path):
    """While another process holds the .part lock, a second download stops early instead of mixing bytes."""
    import fcntl

    c = client()
    f = c.repo_files(REPO)["tiny-Q4_K_M.gguf"]
    dest = tmp_path / "tiny-Q4_K_M.gguf"
    with open(tmp_path / "tiny-Q4_K_M.gguf.part.lock", "a+") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(DownloadError, match="Another edge-agent process is downloading"):
            c.download(f, dest)
    assert c.download(f, dest).read_bytes() == MODEL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-Q4_K_M.gguf"]  # no .part, no .lock left
