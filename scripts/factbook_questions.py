"""Question sets from the Factbook's fields, for `edge-agent eval` (``python scripts/factbook.py questions``).

Writes into OUT_DIR:

- ``dev.jsonl``, ``test.jsonl``: short-answer questions from Factbook fields (capital, independence
  year, internet country code, currency, highest point, aircraft registration prefix, national anthem),
  ``{"id": "fb-pe-capital", "image": null, "question": ..., "answers": [...]}``. A field's value is
  turned into answers only when it is one clean name, year or code (else that country is left out of
  that field); the answers list the forms a correct short answer takes (an alternative name given in
  brackets, the name without accents, a currency's singular and plural and ISO code). Split by country:
  every question of a country is in the split chosen by the SHA-256 of its code (even first byte:
  dev), so nothing learnt about a country on dev helps on test. ``per_field`` questions per field and
  split are kept, the countries taken in an order also fixed by a hash; lines alternate fields, so
  ``--limit N`` takes a mix.
- ``known-dev.jsonl``, ``known-test.jsonl``: questions a small instruct model answers without searching
  (two-digit products, capitals of the most populous countries (from the Factbook), famous facts),
  split by the hash of the id.
- ``README.md``: source, licence, split rule, counts.

Answers are matched by ``edge_agent.evaluation.matching`` (SQuAD normalisation: case, punctuation and
articles dropped; "contains" on word boundaries), so ``.pe`` and ``pe`` are one answer there, and an
answer that is a common word (a domain ``.to``, a prefix ``OK``) would be "contained" in almost any
sentence: such fields are left out for that country.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_agent.evaluation.matching import match_answer, normalize_answer
from scripts.factbook import DEFAULT_TOP, PACKAGE, VERSION, Country, Index, ascii_fold, build_index

# English words that a code would be "contained" in by accident (matching drops punctuation: ".to" -> "to").
COMMON_WORDS = frozenset("""
a an am as at be by do go he hi if in is it me my no of oh ok on or so to up us we ya yo ye ex id la le
""".split())

# Not sovereign states, or no single government: no questions about them.
NOT_COUNTRIES = frozenset({"ee", "xx", "ay", "wi", "pf", "pg", "gz", "we", "tw"})
KNOWN_CAPITALS = 10  # the most populous countries' capitals go to the known set, not the Factbook set


@dataclass(frozen=True)
class FieldSpec:
    key: str  # id suffix: fb-pe-<key>
    question: str  # with {country}
    answers: Callable[[Country], list[str] | None]
    doc: str  # the title of the search document holding the fact, after "<country> - "


# Names a question puts "the" before.
WITH_THE = frozenset({"United States", "United Kingdom", "Netherlands", "Philippines", "United Arab Emirates",
                      "Dominican Republic", "Central African Republic", "Democratic Republic of the Congo",
                      "Republic of the Congo", "Marshall Islands", "Solomon Islands", "Maldives", "Comoros",
                      "Seychelles", "Holy See (Vatican City)", "Federated States of Micronesia"})


def subject(name: str) -> str:
    """The name as it reads inside a question: "the Netherlands", "the Bahamas"."""
    if name.startswith("The "):
        return "the " + name[4:]
    return f"the {name}" if name in WITH_THE else name


def with_variants(names: list[str]) -> list[str]:
    """Each name, its accent-free form and its form without apostrophes inside words or hyphens before a
    small letter ("El'brus" -> "Elbrus", "Halla-san" -> "Hallasan": matching reads them as spaces), once
    each, in order."""
    out: list[str] = []
    for n in names:
        n = n.strip()
        joined = re.sub(r"-(?=[a-z])", "", re.sub(r"(?<=\w)['’](?=\w)", "", ascii_fold(n)))
        for v in (n, ascii_fold(n), joined):
            if normalize_answer(v) and v not in out:
                out.append(v)
    return out


def _words_in(short: str, long: str) -> bool:
    return f" {normalize_answer(short)} " in f" {normalize_answer(long)} "


def _alternatives(paren: str) -> list[str]:
    """Other names given in brackets ("Tarabulus", "Prishtine, Prishtina"); none for a remark ("on Viti
    Levu")."""
    names = [n.strip() for n in re.split(r"[,/]", paren)]
    return names if all(n[:1].isupper() and len(n.split()) <= 3 for n in names) else []


def capital(c: Country) -> list[str] | None:
    t = c.text("Government", "Capital", "name")
    if not t or re.search(r";|capital|note|\baka\b|\bno\b|\bin (Romanian|Russian)\b", t, re.I):
        return None
    m = re.fullmatch(r"([^()]+?)(?:\s*\(([^()]+)\))?", t)
    if not m:
        return None
    names = [m[1]] + (_alternatives(m[2]) if m[2] else [])
    if any(_words_in(n, c.name) or _words_in(c.name, n) for n in names):
        return None  # "Djibouti", "Guatemala City": the question gives it away
    names += ["St. " + n[6:] for n in names if n.startswith("Saint ")]
    return with_variants(names)


MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"


def independence(c: Country) -> list[str] | None:
    """The year of one plain date "(from X)": "28 July 1821 (from Spain)" -> 1821; none for several dates."""
    t = c.text("Government", "Independence")
    m = re.fullmatch(rf"\d{{1,2}}(?:-\d{{1,2}})? (?:{MONTHS}) (\d{{4}}) \(from [^;()]+\)", t)
    return [m[1]] if m else None


def internet_code(c: Country) -> list[str] | None:
    t = c.text("Communications", "Internet country code")
    if not re.fullmatch(r"\.[a-z]{2}", t) or t[1:] in COMMON_WORDS:
        return None
    return [t, t[1:]]


# Plural (as the Factbook writes "... per US dollar") to singular, where dropping an "s" is wrong.
SINGULAR = {"kroner": "krone", "kronor": "krona", "kronur": "krona", "leva": "lev", "lei": "leu",
            "zlotych": "zloty", "koruny": "koruna", "meticais": "metical", "maloti": "loti",
            "emalangeni": "lilangeni", "colones": "colon", "quetzales": "quetzal", "markas": "marka",
            "leke": "lek"}
CFA = {"XOF": "West African CFA franc", "XAF": "Central African CFA franc"}
# The ISO code in use now, where the Factbook gives an older one.
NEW_CODE = {"GHC": "GHS", "MRO": "MRU", "VEB": "VES", "ZMK": "ZMW", "AFA": "AFN", "MZM": "MZN", "STD": "STN",
            "TMM": "TMT", "BYB": "BYN", "SAT": "WST", "KD": "KWD"}
COMMON_CODES = frozenset({"ALL", "TOP", "SAT", "CUP", "MAD", "TRY"})  # words, "contained" in any sentence
CURRENCY_EXTRA = {"pe": ["sol", "Peruvian sol"], "is": ["Israeli new shekel", "shekel"],
                  "bk": ["convertible mark"], "ch": ["renminbi", "yuan", "CNY"], "uk": ["pound sterling"],
                  "bx": ["Brunei dollar"], "bh": ["Belize dollar"], "bb": ["Barbados dollar"],
                  "ae": ["UAE dirham"], "cn": ["Comorian franc"], "by": ["Burundian franc"]}


def _singular(name: str) -> str:
    *head, last = name.split()
    low = last.lower()
    if low in SINGULAR:
        last = SINGULAR[low]
    elif low.endswith("s") and not low.endswith("ss") and len(low) > 3:
        last = last[:-1]
    return " ".join([*head, last])


def currency(c: Country) -> list[str] | None:
    t = c.text("Economy", "Exchange rates", "Currency")
    m = re.fullmatch(r"(.+?)\s*(?:\(([A-Z]{2,3})(?:/[A-Z]{3})?\))?\s+per US dollar\s*-?", t)
    if not m or re.search(r"\bor\b|US dollar|;", m[1]):
        return None
    name, code = m[1], m[2]
    if code in CFA:
        names = [CFA[code], "CFA franc"]
    else:
        names = []
        for n in name.split("/"):  # "togrog/tugriks"
            names += [_singular(n), n]
    codes = [x for x in (code, NEW_CODE.get(code or "")) if x and x not in COMMON_CODES]
    return with_variants(names + codes + CURRENCY_EXTRA.get(c.code, []))


PEAK_PREFIX = re.compile(r"^(Mount|Mt\.|Mont|Monte|Monts|Pico de|Pico "
                         r"da|Pico|Pic|Cerro|Nevado|Volcan|Jebel|Jabal"
                         r"|Gora|Pik|Hora|Kuh-e|Morne|Dealul|Qullai) (?=[A-Z])")


def highest_point(c: Country) -> list[str] | None:
    """The name before the height: "Nevado Huascaran 6,746 m" -> Nevado Huascaran, Huascaran."""
    t = c.text("Geography", "Elevation", "highest point")
    m = re.fullmatch(r"(.+?) [\d,.]+(?: m)?(?: \([^()]*\))?", t)
    if not m or re.search(r"unnamed|note|;|,|\bkm\b|\d|\bof\b", m[1]):
        return None
    name = m[1]
    if len(re.findall(r"\(", name)) > 1:
        return None
    base = re.sub(r"\s*\([^()]*\)", "", name).strip()
    alt = re.fullmatch(r".+?\s*\(([^()]*)\)", name)  # an alternative name right after the whole name
    names = [base]
    if " on " in base:  # "Margherita Peak on Mount Stanley": the peak, and the mountain when it is one
        before, after = base.split(" on ", 1)
        names.insert(0, before)
        names += [after] if re.match(r"(Mount|Mont|Monte) ", after) else []
    else:
        names += _alternatives(alt[1]) if alt else []
    short = PEAK_PREFIX.sub("", names[0])  # "Nevado Huascaran" -> "Huascaran"
    if short != names[0] and len(short) >= 4 and not any(_words_in(short, n)
                                                         for n in [c.name, *c.other_names()]):
        names.append(short)
    names += ["Mount " + n[4:] for n in names if n.startswith("Mt. ")]
    names += [n.rsplit(" ", 1)[0] for n in names if re.search(r" (South|North)$", n)]  # "Kebnekaise South"
    return with_variants(names)


def aircraft_prefix(c: Country) -> list[str] | None:
    t = c.text("Transportation", "Civil aircraft registration country code prefix")
    if not re.fullmatch(r"[A-Z0-9]{2,3}", t) or t.lower() in COMMON_WORDS:
        return None
    return [t]


GENERIC_ANTHEM = re.compile(r"national anthem|state anthem|national hymn|anthem of|^(himno|hino|hymne|inno) "
                            r"nacional|^national|^himnusz$|^hymn$", re.I)


# A royal anthem shared by the Commonwealth realms (their own national anthems differ), and titles that
# are everyday words.
SHARED_OR_WORD_TITLES = frozenset({"God Save the King", "Europe", "Motherland", "Patria"})


def anthem(c: Country) -> list[str] | None:
    """The title in quotes and, when it says more than "National Anthem", its translation."""
    t = c.text("Government", "National anthem(s)", "title").replace("“", '"').replace("”", '"')
    m = re.fullmatch(r'"([^"]+)"\s*(?:\(([^()"]+)\))?', t)
    if not m:
        return None
    title, translation = m[1].strip(" ,"), (m[2] or "").strip()
    if GENERIC_ANTHEM.search(title) or (translation and GENERIC_ANTHEM.search(translation)):
        return None
    if title in SHARED_OR_WORD_TITLES and c.code != "uk":
        return None
    names = [title]
    if len(translation.split()) >= 2:  # "Liberty" alone would be "contained" in too many answers
        names.append(translation)
    return with_variants(names)


FIELDS = [
    FieldSpec("capital", "What is the capital of {country}?", capital, "Government - Capital"),
    FieldSpec("independence", "In what year did {country} become independent?", independence,
              "Government - Independence"),
    FieldSpec("tld", "What is the internet country code (top-level domain) of {country}?", internet_code,
              "Communications - Internet country code"),
    FieldSpec("currency", "What is the currency of {country}?", currency, "Economy - Exchange rates"),
    FieldSpec("highest-point", "What is the highest point in {country}?", highest_point,
              "Geography - Elevation"),
    FieldSpec("aircraft-prefix", "What is the civil aircraft registration prefix of {country}?",
              aircraft_prefix,
              "Transportation - Civil aircraft registration country code prefix"),
    FieldSpec("anthem", "What is the title of the national anthem of {country}?", anthem,
              "Government - National anthem(s)"),
]
FIELD_BY_KEY = {f.key: f for f in FIELDS}


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def split_of(code: str) -> str:
    """dev or test, fixed by the country code alone."""
    return "dev" if digest(f"factbook-split:{code}")[0] % 2 == 0 else "test"


def population(c: Country) -> int:
    m = re.match(r"[\d,]+", c.text("People and Society", "Population", "total"))
    return int(m[0].replace(",", "")) if m else 0


def countries_for_questions(countries: list[Country]) -> list[Country]:
    return [c for c in countries if c.code not in NOT_COUNTRIES
            and "Dependency status" not in c.data.get("Government", {})]


def most_populous(countries: list[Country], n: int = KNOWN_CAPITALS) -> list[Country]:
    return sorted(countries_for_questions(countries), key=population, reverse=True)[:n]


def row(qid: str, question: str, answers: list[str]) -> dict:
    return {"id": qid, "image": None, "question": question, "answers": answers}


def factbook_rows(countries: list[Country], per_field: int = 0,
                  known: set[str] | None = None) -> dict[str, list[dict]]:
    """{"dev": rows, "test": rows}: ``per_field`` (0: all) per field and split, lines alternating fields;
    no capital question for the countries in ``known`` (default: the most populous, whose capitals the
    known set asks)."""
    pool = countries_for_questions(countries)
    famous = {c.code for c in most_populous(countries)} if known is None else known
    by_split: dict[str, list[list[dict]]] = {"dev": [], "test": []}
    for spec in FIELDS:
        lists: dict[str, list[dict]] = {"dev": [], "test": []}
        for c in sorted(pool, key=lambda c: digest(f"{spec.key}:{c.code}")):
            if spec.key == "capital" and c.code in famous:
                continue
            answers = spec.answers(c)
            if answers:
                qid = f"fb-{c.code}-{spec.key}"
                lists[split_of(c.code)].append(row(qid, spec.question.format(country=subject(c.name)),
                                                   answers))
        for s, rows in lists.items():
            by_split[s].append(rows[:per_field] if per_field else rows)
    out: dict[str, list[dict]] = {}
    for s, columns in by_split.items():
        longest = max((len(col) for col in columns), default=0)
        out[s] = [col[i] for i in range(longest) for col in columns if i < len(col)]
    return out


MULTIPLICATIONS = [(17, 23), (12, 34), (45, 67), (19, 28), (36, 41), (58, 73), (24, 86), (91, 13), (62, 47),
                   (75, 39)]
FAMOUS = [
    ("planet", "What is the largest planet in the solar system?", ["Jupiter"]),
    ("mona-lisa", "Who painted the Mona Lisa?", ["Leonardo da Vinci", "da Vinci", "Leonardo"]),
    ("gold", "What is the chemical symbol of gold?", ["Au"]),
    ("water", "What is the chemical formula of water?", ["H2O"]),
    ("romeo", "Who wrote Romeo and Juliet?", ["William Shakespeare", "Shakespeare"]),
    ("boiling", "At what temperature in degrees Celsius does water boil at sea level?", ["100", "100 °C"]),
    ("moon", "Who was the first person to walk on the Moon?", ["Neil Armstrong", "Armstrong"]),
    ("ocean", "What is the largest ocean on Earth?", ["Pacific Ocean", "Pacific"]),
    ("relativity", "Who developed the theory of relativity?", ["Albert Einstein", "Einstein"]),
    ("hexagon", "How many sides does a hexagon have?", ["6", "six"]),
]


def known_rows(countries: list[Country]) -> list[dict]:
    rows = [row(f"known-mul-{a}x{b}", f"What is {a}*{b}?", [str(a * b)]) for a, b in MULTIPLICATIONS]
    for c in most_populous(countries):
        names = [re.sub(r"\s*\([^()]*\)", "", c.text("Government", "Capital", "name")).strip()]
        if c.code == "us":
            names += ["Washington", "Washington DC"]
        rows.append(row(f"known-capital-{c.code}", f"What is the capital of {subject(c.name)}?",
                        with_variants(names)))
    rows += [row(f"known-{key}", q, a) for key, q, a in FAMOUS]
    return rows


def retrieval(index: Index, rows: list[dict], top: int = DEFAULT_TOP) -> dict[str, list[int]]:
    """Per field: [questions, fact's document ranked first, an answer in the first result's content, an
    answer in some result's content], searching each question as written (the service's own ranking)."""
    out: dict[str, list[int]] = {}
    for r in rows:
        code, key = r["id"].split("-", 2)[1:]
        hits = [d for d, _ in index.search(r["question"], top)]
        first = (bool(hits) and hits[0].country == code
                 and hits[0].title.endswith(" - " + FIELD_BY_KEY[key].doc))
        found = [match_answer(d.content, r["answers"])[1] for d in hits]
        n = out.setdefault(key, [0, 0, 0, 0])
        for i, ok in enumerate((True, first, bool(found) and found[0], any(found))):
            n[i] += int(ok)
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def field_counts(rows: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        key = r["id"].split("-", 2)[2]
        out[key] = out.get(key, 0) + 1
    return out


def write_sets(out_dir: Path, countries: list[Country], per_field: int = 12) -> str:
    """Write every set and the README into ``out_dir``; returns the README's counts table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sets = factbook_rows(countries, per_field)
    known = known_rows(countries)
    known_split = {s: [r for r in known if (digest(r["id"])[0] % 2 == 0) == (s == "dev")]
                   for s in ("dev", "test")}
    for s in ("dev", "test"):
        write_jsonl(out_dir / f"{s}.jsonl", sets[s])
        write_jsonl(out_dir / f"known-{s}.jsonl", known_split[s])
    counts = {s: field_counts(sets[s]) for s in sets}
    found = retrieval(build_index(countries), sets["dev"] + sets["test"])
    table = ["| field | question | dev | test | fact's field ranked first | answer in result 1 | in results "
             "1-5 |",
             "|---|---|---|---|---|---|---|"]
    total = [0, 0, 0, 0]
    for spec in FIELDS:
        n = found.get(spec.key, [0, 0, 0, 0])
        total = [a + b for a, b in zip(total, n, strict=True)]
        table.append(f"| {spec.key} | {spec.question} | {counts['dev'].get(spec.key, 0)} | "
                     f"{counts['test'].get(spec.key, 0)} | {n[1]} | {n[2]} | {n[3]} |")
    table.append(f"| **all** | | **{len(sets['dev'])}** | **{len(sets['test'])}** | {total[1]} | {total[2]} "
                 "| "
                 f"{total[3]} |")
    nations = {s: len({r['id'].split('-')[1] for r in sets[s]}) for s in sets}
    summary = (f"dev: {len(sets['dev'])} questions ({nations['dev']} countries), test: {len(sets['test'])} "
               f"({nations['test']} countries); known-dev: {len(known_split['dev'])}, "
               f"known-test: {len(known_split['test'])}")
    (out_dir / "README.md").write_text(README.format(package=PACKAGE, version=VERSION, per_field=per_field,
                                                     table="\n".join(table), summary=summary),
                                       encoding="utf-8")
    return summary + "\n" + "\n".join(table)


README = """# Factbook question sets

Written by `python scripts/factbook.py questions OUT_DIR --per-field {per_field}` from the CIA World
Factbook as packaged on PyPI: `{package}=={version}` (the Factbook is a work of the US government, in
the public domain; the package is MIT-licensed). Answer them with the agent searching
`python scripts/factbook.py serve` (a SearXNG-compatible service over the same data), e.g.
`EDGE_AGENT_TEXT_SEARCH=searxng EDGE_AGENT_SEARXNG_URL=http://127.0.0.1:8890 edge-agent eval test.jsonl`.

- `dev.jsonl`, `test.jsonl`: one question per country and field, with the accepted answers (an
  alternative name in the Factbook's brackets, the name without accents, a currency's singular,
  plural and ISO code). A country enters a field only when its value is one clean name, year or
  code. **Split by country**: a country's questions are all in `dev` when the first byte of
  SHA-256("factbook-split:" + its Factbook code) is even, else in `test`. Per field and split, the
  first {per_field} countries in the order of SHA-256(field + ":" + code) are kept; lines alternate
  fields, so `--limit N` takes a mix. Tune prompts and defaults on `dev` only.
- `known-dev.jsonl`, `known-test.jsonl`: questions a small instruct model answers without searching:
  two-digit products, the capitals of the 10 most populous countries (by the Factbook's population),
  famous facts. Split by the first byte of SHA-256(id). The Factbook sets leave those capitals out.

{summary}.

The last three columns: each question searched as written on the service (top 5),
dev and test together: how often the country's field that holds the fact came first, and an accepted
answer was in the first result's content, or in one of the five.

{table}
"""
