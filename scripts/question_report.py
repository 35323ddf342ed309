"""The report of ``scripts/bench_question.py``: the top-level keys from the measured phases, the phase
table (Markdown) and ``--record`` (``edge_agent/data/question_costs.json``, what the first-run screen
quotes). Knows the result's layout, nothing of how it was measured."""

from __future__ import annotations

import json
import time
from typing import Any

VARIANTS = ("ssr", "freeform", "ssr_read_ahead", "oneshot")
COLUMNS = {"ssr": "SSR", "freeform": "free-form", "ssr_read_ahead": "SSR, photo + question read ahead",
           "oneshot": "one-shot: llama.cpp alone"}


def summarise(shape: str, raw: dict[str, Any], q: dict[str, Any], mem: dict[str, Any]) -> dict[str, Any]:
    m = q["medians"]
    ssr, ff = m["ssr"], m["freeform"]
    # the app's answer tokens against llama.cpp decoding after as many cells (attention reads them all)
    best_s = (raw.get("best_decode_ms_at_depth") or raw["best_decode_ms"]) / 1000
    app_ms = ssr.get("answer_ms_per_token")
    cold, warm = q["cold"], ssr
    return {
        **oneshot_keys(raw, m, app_ms),
        "shape": shape,
        "ssr_over_freeform_question": round(ssr["question_s"] / ff["question_s"], 3),
        "image_read_share": round(ssr["image_read_s"] / ssr["question_s"], 3),
        "peak_rss_mb": round(mem["peak_rss_mb"], 1),
        "peak_rss_mb_with_prophet": None if mem.get("peak_rss_mb_with_prophet") is None
        else round(mem["peak_rss_mb_with_prophet"], 1),
        "prefill_tokens_per_s": max(raw["prefill_tokens_per_s"].values()),
        "prefill_tokens_per_s_app": raw["prefill_tokens_per_s"].get(str(raw["app_threads"]["batch"])),
        "decode_tokens_per_s": round(1000 / raw["best_decode_ms"], 2),
        "decode_tokens_per_s_at_depth": round(1 / best_s, 2),
        "decode_overhead_vs_short_context": round(app_ms / raw["best_decode_ms"], 3) if app_ms else None,
        "decode_overhead": round(app_ms / 1000 / best_s, 3) if app_ms else None,
        "vision_encode_s": ssr.get("image_encode_s"),
        "read_ahead_over_ssr_question": round(m["ssr_read_ahead"]["question_s"] / ssr["question_s"], 3),
        # context opening without the photo: the first question evaluates the system prompt, the
        # later ones restore its saved state (or keep it in the KV cache)
        "system_prompt": {"tokens": warm.get("open_reused"),  # what a later question's context kept
                          "open_s_evaluated": round(cold.get("question_open_s", 0.0), 3),
                          "open_s_restored": warm.get("question_open_s")},
        "app_answer_ms_per_token": app_ms,
        "zoom_breakdown": zoom_breakdown(ssr),
        # every raw generate's log-probs and every SSR question's rationale scores were finite numbers
        "logits_finite": bool(raw.get("logprobs_finite", True)
                              and all(r.get("scores_finite", True) and r.get("logits_finite", True)
                                      for rs in q["runs"].values() for r in rs)),
        "raw": raw,
        "memory": mem,
        "phases": m,
        "cold_question": cold,
        "runs": q["runs"],
    }


def oneshot_keys(raw: dict[str, Any], m: dict[str, Any], app_ms: float | None) -> dict[str, Any]:
    """The one-shot baseline (issue 28): question wall seconds over llama.cpp alone answering in one shot,
    and the app's answer decode and prompt prefill over llama.cpp's own defaults at the same context
    length (the same machine, file and tokens, sampled in the same rounds). None without the baseline."""
    one = m.get("oneshot")
    base = raw.get("llamacpp_defaults") or {}
    if not one:
        return {"oneshot_s": None, "ssr_over_oneshot": None, "read_ahead_over_oneshot": None,
                "crop_floor_over_oneshot": None}
    pre, app_pre, deep = (base.get("prefill_tokens_per_s"), base.get("app_prefill_tokens_per_s"),
                          base.get("decode_ms_at_depth"))
    ssr = m["ssr"]
    crop_s = (ssr.get("crop_encode_s") or 0.0) + (ssr.get("crop_decode_s") or 0.0)
    return {
        "oneshot_s": round(one["question_s"], 3),
        "ssr_over_oneshot": round(ssr["question_s"] / one["question_s"], 3),
        # the least a question with a zoom can cost against the one-shot at this crop size: the one-shot's
        # work and the crop read as the SSR question read it (its encode and decode, at llama.cpp's speed),
        # as if the rationale scoring, the action and the observation's text took no time
        "crop_floor_over_oneshot": round((one["question_s"] + crop_s) / one["question_s"], 3),
        "read_ahead_over_oneshot": round(m["ssr_read_ahead"]["question_s"] / one["question_s"], 3),
        "answer_decode_over_llamacpp_defaults": round(app_ms / deep, 3) if app_ms and deep else None,
        "prefill_over_llamacpp_defaults": round(pre / app_pre, 3) if pre and app_pre else None,
    }


def zoom_breakdown(ph: dict[str, Any]) -> dict[str, Any] | None:
    """The zoom turn's observation against the photo, per token (issue 28 item 3): the crop's vision encode
    and its tokens' decode in ms per image token beside the photo's, and the seconds of the observation's
    text (the observation in all less the crop's encode and decode). None without a crop."""
    n, n0 = ph.get("crop_tokens"), ph.get("image_tokens")
    if not n or not n0 or ph.get("image_read_ahead"):
        return None

    def per_token(s: float | None, k: float) -> float | None:
        return round(1000 * s / k, 2) if s else None

    enc, dec = ph.get("crop_encode_s"), ph.get("crop_decode_s")
    return {"crop_tokens": n, "photo_tokens": n0,
            "crop_encode_ms_per_token": per_token(enc, n),
            "photo_encode_ms_per_token": per_token(ph.get("image_encode_s"), n0),
            "crop_decode_ms_per_token": per_token(dec, n),
            "photo_decode_ms_per_token": per_token(ph.get("image_decode_s"), n0),
            "observation_text_s": round(ph.get("zoom_observe_s", 0.0) - (enc or 0.0) - (dec or 0.0), 3)}


def record(res: dict[str, Any], command: str) -> dict[str, Any]:
    """Put this run's costs under its shape in ``footprint.QUESTION_COSTS`` (other shapes kept)."""
    from edge_agent.modelfiles import footprint

    ph = res["phases"]
    entry = {
        "cores": res["cores"], "command": command, "date": time.strftime("%Y-%m-%d"),
        "ssr_question_s": round(ph["ssr"]["question_s"], 1),
        "freeform_question_s": round(ph["freeform"]["question_s"], 1),
        "read_ahead_question_s": round(ph["ssr_read_ahead"]["question_s"], 1),
        "oneshot_s": round(res["oneshot_s"], 1) if res.get("oneshot_s") else None,
        "ssr_over_freeform_question": res["ssr_over_freeform_question"],
        "answer_tokens_per_s": round(1000 / res["app_answer_ms_per_token"], 2)
        if res["app_answer_ms_per_token"] else None,
        **{k: res[k]
           for k in ("decode_tokens_per_s", "prefill_tokens_per_s", "vision_encode_s", "peak_rss_mb",
                               "peak_rss_mb_with_prophet", "decode_overhead", "image_read_share")},
    }
    path = footprint.QUESTION_COSTS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    data.setdefault("about", "What one photo question cost on the Qwen3-VL stand-ins "
                             "(scripts/bench_question.py --record); the app's first-run screen quotes it.")
    data.setdefault("shapes", {})[res["shape"]] = entry
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return entry


PHASE_ROWS = [
    ("vision encode of the photo", "image_encode_s", None),
    ("photo tokens decoded", "image_decode_s", "image_tokens"),
    ("photo read in one helper call (encode + decode)", "oneshot_image_s", None),
    ("context opened (system prompt restored + question)", "question_open_s", "question_tokens"),
    ("SSR scoring (both turns)", "scoring_s", None),
    ("free-form reasoning (both turns)", "reasoning_s", "reasoning_tokens"),
    ("zoom action decode", "zoom_action_s", None),
    ("zoom: crop made", "zoom_tool_s", None),
    ("zoom: crop encode", "crop_encode_s", None),
    ("zoom: crop tokens decoded", "crop_decode_s", "crop_tokens"),
    ("zoom: observation in all (its text + the crop)", "zoom_observe_s", None),
    ("answer decode", "answer_s", "answer_tokens"),
    ("question (wall)", "question_s", "tokens_evaluated"),
]


def table(res: dict[str, Any]) -> str:
    """The phase table (Markdown) of a result."""
    ph = res["phases"]
    cols = [v for v in VARIANTS if v in ph]
    lines = ["| phase | " + " | ".join(COLUMNS[v] for v in cols) + " |", "|---|" + "---|" * len(cols)]
    for label, key, tok in PHASE_ROWS:
        cells = []
        for v in cols:
            x = ph[v].get(key)
            n = ph[v].get(tok) if tok else None
            if key.startswith("image_") and ph[v].get("image_read_ahead"):
                cells.append("read ahead")
            else:
                cells.append("-" if not x else f"{x:.2f} s" + (f" ({n:.0f} tok)" if n else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


