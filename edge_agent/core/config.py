"""One typed settings object, read from a TOML file and ``EDGE_AGENT_*`` environment variables.

Nothing happens at import time. Paths live in one place: everything the app writes is under
``Settings.home`` (``$EDGE_AGENT_HOME``, default ``$XDG_DATA_HOME/edge-agent`` or
``~/.local/share/edge-agent``), so a test can point the whole app at a temp dir with one variable.

Precedence (lowest to highest): defaults < ``home/config.toml`` < environment < explicit overrides
(CLI flags, the TUI settings screen).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

import tomli_w

from edge_agent.core.errors import ConfigError

ENV_PREFIX = "EDGE_AGENT_"

# Settings whose values are secrets: never written to logs, transcripts, cache keys or exports.
SECRET_FIELDS = frozenset({"brave_api_key", "gcv_api_key", "serpapi_api_key"})


def default_home() -> Path:
    env = os.environ.get("EDGE_AGENT_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "edge-agent"


CHOICES: dict[str, tuple[str, ...]] = {
    "mode": ("ssr", "freeform", "direct"),
    "text_search": ("wikipedia", "searxng", "brave"),
    "image_search": ("none", "gcv", "serpapi"),
    "extra_buffers": ("auto", "on", "off"),
    "kv_type": ("auto", "f16", "q8_0"),
    "ssr_score": ("pmi", "raw"),
}
# name -> (low, high or None, low excluded): the values that can work
RANGES: dict[str, tuple[float, float | None, bool]] = {
    "n_ctx": (256, 262144, False),  # llama.cpp's least; Qwen3-VL's longest context
    "max_turns": (1, 50, False),
    "ssr_tau": (0, 100, True),
    "ssr_answer_check": (-20, 0, False),
    "ssr_answer_check_tokens": (1, 64, False),
    "ssr_answer_check_reach": (0, 128, False),
    "ssr_answer_check_agree": (0, 8, False),
    "freeform_max_tokens": (1, 8192, False),
    "answer_max_tokens": (1, 8192, False),
    "temperature": (0, 5, False),
    "seprod_draft_len": (1, 128, False),
    "seprod_tau": (0, 1, False),  # s_j, a weighted geometric mean of probabilities, is in [0, 1]
    "seprod_a0": (0, 1, False),  # a weight
    "image_max_tokens": (16, 16384, False),
    "crop_max_tokens": (16, 16384, False),
    "observation_max_tokens": (0, None, False),
    "state_cache_mb": (0, None, False),
    "search_top_k": (1, 50, False),
    "search_timeout": (0, 600, True),
    "search_cache_days": (0, None, False),
}
HINTS = {
    "seprod_tau": " It is a threshold on s_j, which is between 0 and 1 (0.05 accepts about half of SmolLM2's "
                  "drafts).",
    "temperature": " 0 is greedy; 0.7-1 samples.",
    "image_max_tokens": " 576 is a 768x768 image.",
    "crop_max_tokens": " 256 is a 512x512 crop.",
    "observation_max_tokens": " 0: no limit.",
    "state_cache_mb": " 0 saves no context states.",
}
URL_FIELDS = ("wikipedia_url", "searxng_url", "brave_url", "gcv_url", "serpapi_url",
              "public_image_url_prefix")
URL_EXAMPLES = {"searxng_url": "http://localhost:8888"}
# Textual's built-in themes (the app registers none of its own); tests/test_cli_saved_state.py keeps
# this equal to textual.theme.BUILTIN_THEMES (config must not import Textual).
THEMES = frozenset({
    "ansi-dark", "ansi-light", "atom-one-dark", "atom-one-light", "catppuccin-frappe", "catppuccin-latte",
    "catppuccin-macchiato", "catppuccin-mocha", "dracula", "flexoki", "gruvbox", "monokai", "nord",
    "rose-pine",
    "rose-pine-dawn", "rose-pine-moon", "solarized-dark", "solarized-light", "textual-dark", "textual-light",
    "tokyo-night",
})


def _is_url(value: str) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _doc(text: str, **kw: Any) -> Any:
    return field(metadata={"doc": text}, **kw)


@dataclass
class Settings:
    """All settings. Field docs double as the help text of the settings screen."""

    home: Path = _doc("Where edge-agent keeps models, cache, chats and config.", default_factory=default_home)

    # --- models -------------------------------------------------------------------------------
    model: str = _doc("Agent model: a catalog name or a path to a GGUF file. Empty: the default installed "
                      "model.", default="")
    mmproj: str = _doc("Vision projector (mmproj) GGUF for the agent model. Empty: from the catalog / next "
                       "to the model.", default="")
    prophet: str = _doc("SeProD prophet (base) model: a catalog name or a GGUF path. Empty: SeProD off.",
                        default="")
    prophet_mmproj: str = _doc("mmproj GGUF for the prophet model.", default="")
    n_ctx: int = _doc("Context length in tokens for each model: the most a chat's context holds (with "
                      "kv_type auto a large model's starts smaller and grows to it).", default=8192)
    n_threads: int = _doc("Threads for token-by-token decoding. 0: a sensible default for this machine.",
                          default=0)
    n_threads_batch: int = _doc("Threads for prompt and batched evaluation. 0: a sensible default.",
                                default=0)
    extra_buffers: str = _doc("llama.cpp extra (repacked/AMX) weight buffers: auto, on or off.",
                              default="auto")
    kv_type: str = _doc(
        "KV cache type: auto (f16 without flash attention on a CPU, what decodes and prefills fastest on the "
        "2-core machines measured; when an f16 cache of n_ctx would exceed 512 MB the context starts at "
        "2,048 cells, a photo question with a zoom, and grows to n_ctx as a chat needs it: Qwen3-VL-2B "
        "starts at 224 MB), f16 (all of n_ctx from the start) or q8_0 (half the memory, with flash "
        "attention: slower on a CPU).",
        default="auto")
    theme: str = _doc("The app's colour theme (Ctrl+P, Change theme). Empty: the default.", default="")

    # --- agent --------------------------------------------------------------------------------
    mode: str = _doc("Reasoning mode: ssr (scored rationales), freeform (the model writes its reasoning) or "
                     "direct (the model alone in a plain chat: no tools, no agent).", default="ssr")
    max_turns: int = _doc("Most tool calls per question; then one more turn must answer.", default=5)
    ssr_tau: float = _doc("SSR softmax temperature over rationale scores.", default=1.0)
    ssr_sample: bool = _doc("SSR: sample a rationale (seeded) instead of taking the best.", default=False)
    ssr_score: str = _doc(
        "SSR score of a rationale: pmi (its mean log-prob minus its mean log-prob after a neutral question: "
        "how well it fits this context, Holtzman et al. 2021) or raw (the paper's mean log-prob).",
        default="pmi")
    ssr_answer_check: float = _doc(
        "SSR: before answering from what it knows (no tool result read yet, a search still possible), the "
        "agent decodes the answer's first tokens (ssr_answer_check_tokens); when the mean log-prob of those "
        "that add to the question (not its own words restated) is below this, it is not sure and searches "
        "first (the tokens are kept when it answers). -20 turns the check off.", default=-0.225)
    ssr_answer_check_tokens: int = _doc(
        "SSR: how many of the answer's first tokens the answer check (ssr_answer_check) reads: enough to "
        "reach the fact after a restated question.", default=10)
    ssr_answer_check_reach: int = _doc(
        "SSR: when none of the answer check's tokens adds to the question yet (a long question restated), it "
        "reads on until one does, at most this many tokens (0: ssr_answer_check_tokens exactly).", default=32)
    ssr_answer_check_agree: int = _doc(
        "SSR: when the answer check doubts the first word an answer adds, it continues this many likeliest "
        "other words there; those whose answer names the same thing ('Isaac Newton' beside 'Newton') add "
        "their probability to it (0: no second look).", default=3)
    ssr_search_when_asked: bool = _doc(
        "SSR: a question that asks to search or to check ('Are you sure? Please check.', 'Search the web for "
        "...') searches first, whatever the answer check and the scores say. false: they decide.",
        default=True)
    ssr_index_only: bool = _doc("SSR ablation: score only the index '[k]' of each rationale, not its text.",
                                default=False)
    rationales: str = _doc("Path to your own rationale library (JSON). Empty: the built-in one.", default="")
    freeform_max_tokens: int = _doc("Free-form mode: most reasoning tokens per turn.", default=128)
    answer_max_tokens: int = _doc("Most tokens in an answer.", default=256)
    temperature: float = _doc("Sampling temperature for actions and answers (0: greedy).", default=0.0)
    system_prompt: str = _doc(
        "Your own instructions, added to the model's system prompt (e.g. 'Answer in one short sentence.'). "
        "Empty: none.", default="")
    seed: int = _doc("Random seed for sampling.", default=0)

    # --- SeProD -------------------------------------------------------------------------------
    seprod: bool = _doc("Use the prophet model to draft (SeProD) when one is configured.", default=True)
    seprod_draft_len: int = _doc("SeProD: tokens the prophet drafts per round (L_d).", default=16)
    seprod_tau: float = _doc(
        "SeProD: acceptance threshold on the combined score s_j (0.05 accepted half of SmolLM2's drafts, 0.1 "
        "a fifth).",
        default=0.05,
    )
    seprod_a0: float = _doc("SeProD: base weight a0 of the search model in s_j.", default=0.5)
    seprod_adaptive: bool = _doc(
        "SeProD: per chat, stop drafting in a mode whose drafts are not accepted and shorten L_d to what is "
        "accepted, and use a draft only when it is ready in time or worth waiting for (false pins "
        "seprod_draft_len and waits for every draft: experiments whose drafts do not depend on timing).",
        default=True,
    )

    # --- input budgets and saved context states ------------------------------------------------
    image_max_tokens: int = _doc(
        "Most tokens an attached image becomes (Qwen3-VL: one token per 32x32 px; 576 = 768x768). Each token "
        "is prefilled once per chat: on a laptop CPU a 2B model reads ~20-100 tokens/s.",
        default=576,
    )
    crop_max_tokens: int = _doc(
        "Most tokens one zoomed crop becomes (256 = 512x512 px, the least Qwen3-VL's own zoom tool gives "
        "it). Every zoom pays this in the context: on 2 CPU cores a 2B model reads a 256-token crop in "
        "~10 s, a 128-token one in ~4 s.",
        default=256,
    )
    observation_max_tokens: int = _doc(
        "Most tokens of a tool result's text the model reads (longer results are cut; 0: no limit). 320 "
        "holds three whole search results (~305 tokens; five take ~500).", default=320,
    )
    type_ahead: bool = _doc(
        "Read the question into the model while you type it (whole words, in the background), so Enter "
        "leaves only the last word or two to read. Off saves battery; an attached photo is read on attach "
        "either way.",
        default=True,
    )
    state_cache_mb: int = _doc(
        "Disk budget for saved context states (system prompt, end of each chat's last answer) in MB, least "
        "recently used out; 0 saves none. Qwen3-VL-2B with an F16 KV cache takes ~112 KB per token.",
        default=2048,
    )

    # --- search and cache ---------------------------------------------------------------------
    offline: bool = _doc("Serve searches from the cache only; never touch the network.", default=False)
    text_search: str = _doc("Text search backend: wikipedia, searxng or brave.", default="wikipedia")
    image_search: str = _doc("Image search backend: none, gcv (Google Cloud Vision) or serpapi (Google "
                             "Lens).", default="none")
    search_top_k: int = _doc("Results per search.", default=5)
    search_timeout: float = _doc("Seconds before a search request gives up.", default=10.0)
    search_cache_days: float = _doc(
        "Online, a cached search younger than this many days is reused instead of asking again "
        "(0: always ask; offline, and when a search fails, the cache is used whatever its age).",
        default=30.0,
    )
    wikipedia_url: str = _doc("Wikipedia API endpoint.", default="https://en.wikipedia.org/w/api.php")
    searxng_url: str = _doc("Your SearXNG instance, e.g. http://localhost:8888.", default="")
    brave_url: str = _doc("Brave Search API endpoint.",
                          default="https://api.search.brave.com/res/v1/web/search")
    brave_api_key: str = _doc("Brave Search API key (secret).", default="")
    gcv_url: str = _doc("Google Cloud Vision endpoint.",
                        default="https://vision.googleapis.com/v1/images:annotate")
    gcv_api_key: str = _doc("Google Cloud Vision API key (secret).", default="")
    serpapi_url: str = _doc("SerpApi endpoint.", default="https://serpapi.com/search.json")
    serpapi_api_key: str = _doc("SerpApi key (secret).", default="")
    public_image_url_prefix: str = _doc(
        "SerpApi Google Lens needs a public URL for the image: a prefix under which you publish images "
        "(the app uploads nothing; you must sync `home/public/` there yourself).",
        default="",
    )

    # --- derived values (not settings of their own) --------------------------------------------
    @property
    def vision_max_tokens(self) -> int:
        """The most tokens any one image becomes, an attached one or a crop: the bound the vision tower is
        loaded with (mtmd's ``image_max_tokens``) and the image a prophet's context holds."""
        return max(self.image_max_tokens, self.crop_max_tokens, 0)

    @property
    def config_path(self) -> Path:
        return self.home / "config.toml"

    @property
    def models_dir(self) -> Path:
        return Path(os.environ.get("EDGE_AGENT_MODELS_DIR", "") or self.home / "models")

    @property
    def cache_path(self) -> Path:
        return self.home / "search-cache.sqlite3"

    @property
    def chats_path(self) -> Path:
        return self.home / "chats.sqlite3"

    @property
    def crops_dir(self) -> Path:
        return self.home / "crops"

    @property
    def states_dir(self) -> Path:
        return self.home / "states"

    # --- loading and saving -------------------------------------------------------------------
    @classmethod
    def load(cls, overrides: dict[str, Any] | None = None, *, env: dict[str, str] | None = None,
             check: Callable[[Settings], None] | None = None) -> Settings:
        """Defaults < config file < environment < ``overrides`` (None values in overrides are ignored).
        ``check``: passed to :meth:`validate`."""
        env = dict(os.environ) if env is None else env
        s = cls()
        if "EDGE_AGENT_HOME" in env:
            s.home = Path(env["EDGE_AGENT_HOME"]).expanduser()
        if s.config_path.exists():
            s = s.updated(_read_config(s.config_path), source=str(s.config_path))
        from_env = {
            f.name: env[ENV_PREFIX + f.name.upper()]
            for f in fields(cls)
            if f.name != "home" and ENV_PREFIX + f.name.upper() in env
        }
        s = s.updated(from_env, source="environment")
        if overrides:
            s = s.updated({k: v for k, v in overrides.items() if v is not None}, source="command line")
        s.validate(check=check)
        return s

    def updated(self, values: dict[str, Any], source: str = "settings") -> Settings:
        """A copy with ``values`` applied, each converted to the field's type (strings accepted)."""
        hints = get_type_hints(type(self))
        names = {f.name for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in names:
                raise ConfigError(f"Unknown setting {key!r} in {source}. Known settings: "
                                  f"{', '.join(sorted(names))}.")
            changes[key] = _convert(key, raw, hints[key], source)
        return dataclasses.replace(self, **changes)

    def validate(self, *, check: Callable[[Settings], None] | None = None) -> None:
        """Raise ConfigError for the first setting whose value cannot work, naming it and its valid range.

        ``check``: a further check by a layer that knows more than the settings
        (``agent.prompts.check_n_ctx``: n_ctx against the system prompt these settings make), run before the
        ranges: a too small n_ctx is best named by the number the prompt needs."""
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"Setting {name} must be one of {', '.join(allowed)}, not "
                                  f"{getattr(self, name)!r}.")
        if self.theme and self.theme not in THEMES:
            raise ConfigError(f"Setting theme must be empty (the default) or one of "
                              f"{', '.join(sorted(THEMES))}, not {self.theme!r}.")
        if check is not None:
            check(self)
        for name, (lo, hi, lo_open) in RANGES.items():
            value = getattr(self, name)
            if value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
                low = f"greater than {lo}" if lo_open else f"at least {lo}"
                if hi is None:
                    bounds = low
                elif lo_open:
                    bounds = f"{low} and at most {hi}"
                else:
                    bounds = f"between {lo} and {hi}"
                raise ConfigError(f"Setting {name} must be {bounds}, not {value!r}.{HINTS.get(name, '')}")
        for name in URL_FIELDS:
            value = getattr(self, name)
            if value and not _is_url(value):
                raise ConfigError(f"Setting {name} must be an http:// or https:// URL with a host "
                                  f"(e.g. {URL_EXAMPLES.get(name, 'https://example.org')}), not {value!r}.")
        cpus = os.cpu_count() or 1
        for name in ("n_threads", "n_threads_batch"):
            n = getattr(self, name)
            if not 0 <= n <= cpus:
                raise ConfigError(
                    f"Setting {name} must be between 0 and {cpus} (this machine has {cpus} CPU threads; "
                    f"more threads than that only slow llama.cpp down), not {n}. 0 picks one per physical "
                    f"core: `edge-agent config set {name} 0`.")
        for name in ("freeform_max_tokens", "answer_max_tokens"):
            if getattr(self, name) > self.n_ctx // 2:
                raise ConfigError(f"Setting {name} must be at most half of n_ctx ({self.n_ctx // 2}), "
                                  f"not {getattr(self, name)}.")

    def save(self, keys: list[str] | None = None) -> Path:
        """Write the settings that differ from the defaults (or ``keys``) to ``config_path``."""
        default = Settings(home=self.home)
        out = {}
        for f in fields(self):
            if f.name == "home":
                continue
            v = getattr(self, f.name)
            if (keys is not None and f.name in keys) or (keys is None and v != getattr(default, f.name)):
                out[f.name] = v
        from edge_agent.core.files import atomic_write

        # private (0600), as gh and aws keep their credentials: the file may hold API keys
        return atomic_write(self.config_path, _dump_toml(out), private=True)

    def public_dict(self) -> dict[str, Any]:
        """Settings as plain values with secrets masked: safe for logs, exports and `--json`."""
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in SECRET_FIELDS:
                v = "***" if v else ""
            d[f.name] = str(v) if isinstance(v, Path) else v
        return d

    def secrets(self) -> list[str]:
        """The secret values in use (for scrubbing text before it is logged or stored)."""
        return [getattr(self, n) for n in SECRET_FIELDS if getattr(self, n)]


def _read_config(path: Path) -> dict[str, Any]:
    """The settings in ``path``. A file that is not TOML (or not UTF-8) is set aside, kept, and the
    defaults are used; the person is told once (``edge_agent.core.recovery.notice``)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        from edge_agent.core import recovery

        try:
            aside = recovery.set_aside(path)
        except FileNotFoundError:  # another process set it aside just now
            return {}
        recovery.notice(f"The settings file {path} could not be read ({e}). It is kept as {aside}; "
                        f"edge-agent "
                        "runs on the default settings until you set them again (`edge-agent config set`).")
        return {}


def _convert(key: str, raw: Any, typ: Any, source: str) -> Any:
    try:
        if typ is bool:
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if typ is int:
            if isinstance(raw, bool):
                raise ValueError(raw)
            return int(raw)
        if typ is float:
            return float(raw)
        if typ is Path:
            return Path(str(raw)).expanduser()
        return str(raw)
    except (TypeError, ValueError):
        kind = {int: "a whole number", float: "a number", bool: "true or false"}.get(typ, f"a {typ.__name__}")
        raise ConfigError(f"Setting {key} from {source} must be {kind}, got {raw!r}.") from None


def _dump_toml(values: dict[str, Any]) -> str:
    """The config file: a comment, then one ``key = value`` per setting (tomli-w quotes and escapes)."""
    plain = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in values.items()}
    return ("# edge-agent settings. Every key, its meaning and its valid values: `edge-agent config "
            "explain`.\n") + tomli_w.dumps(plain)
