"""SeProD's cost model and adaptive rule: when a draft is worth waiting for, when a mode is switched
off for a chat, how long a draft should be, and how many threads the prophet gets.

Knows running estimates of measured times (agent token, prophet token, verification) and per-mode
acceptance. Does not know models, sessions or prompts: the drafter in ``edge_agent.agent.seprod``
feeds it measurements and asks it for a plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from edge_agent.agent.seprod_math import DRAFT_MODES

# --------------------------------------------------------------------------------------------------
# Costs and the adaptive rule (pure logic; the drafter feeds them measurements)
# --------------------------------------------------------------------------------------------------

# Before anything is measured. PRIOR_ACCEPTANCE: the share of a draft a new chat expects accepted
# (the benchmark's SmolLM2 pair accepts about half at tau 0.05). PRIOR_VERIFY_RATIO: verifying L
# tokens in one decode costs this share of decoding them one by one (measured 0.34-0.48 on 2 cores).
PRIOR_ACCEPTANCE = 0.5
PRIOR_VERIFY_RATIO = 0.4
EMA_WEIGHT = 0.3  # weight of the newest measurement in the running cost estimates
WINDOW = 4  # rounds per mode the adaptive rule looks back on
MIN_ROUNDS_TO_SWITCH_OFF = 2
PROBE_EVERY = 4  # a mode switched off drafts again after this many skipped rounds (acceptance may recover)
MAX_PROBE_GAP = 32  # drafts that never fit in time are probed at most this rarely (the gap doubles)
MIN_DRAFT_LEN = 4


def ema(old: float | None, new: float) -> float:
    """The running cost estimate after measuring ``new`` (``new`` itself for the first measurement)."""
    return new if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * new


@dataclass
class Costs:
    """Measured costs in seconds (running averages; None until measured). Machine properties: they
    survive :meth:`Drafter.reset` (new questions, new chats).

    ``agent_token``: the agent's time per decoded token (the loop reports its answer generations);
    until one is seen, the prophet's own per-token time times ``agent_cost_ratio`` stands in.
    ``verify_token``: verification time per scored token. ``prefill_new_image`` / ``prefill_same_image``:
    prophet time from starting a draft to its first token, with and without putting an image in.
    """

    agent_cost_ratio: float = 1.0
    agent_token: float | None = None
    prophet_token: float | None = None
    verify_token: float | None = None
    prefill_new_image: float | None = None
    prefill_same_image: float | None = None
    # mode -> seconds from preparing a draft (Drafter.start) to the hook that uses it: how long the
    # agent works meanwhile, i.e. how much drafting can be hidden
    lead: dict[str, float] = field(default_factory=dict)

    def prophet_seconds(self) -> float | None:
        """The prophet's seconds per drafted token: measured, else the agent's scaled by the size ratio."""
        if self.prophet_token is not None:
            return self.prophet_token
        return None if self.agent_token is None else self.agent_token / self.agent_cost_ratio

    def draft_seconds(self, draft_len: int, *, new_image: bool) -> float | None:
        """Expected prophet seconds for a draft of ``draft_len`` tokens, prompt included; None if unknown."""
        pre = self.prefill_new_image if new_image else self.prefill_same_image
        per_tok = self.prophet_seconds()
        if pre is None or per_tok is None:
            return None
        return pre + draft_len * per_tok

    def token_seconds(self, prophet_token: float | None = None) -> float | None:
        """Expected agent seconds per decoded token, or None when nothing is known yet.
        ``prophet_token``: the prophet's rate measured on the draft in flight (when nothing else is)."""
        if self.agent_token is not None:
            return self.agent_token
        rate = self.prophet_token if self.prophet_token is not None else prophet_token
        return None if rate is None else rate * self.agent_cost_ratio

    def verify_seconds(self, n_tokens: int, prophet_token: float | None = None) -> float | None:
        if self.verify_token is not None:
            return self.verify_token * n_tokens
        t = self.token_seconds(prophet_token)
        return None if t is None else PRIOR_VERIFY_RATIO * n_tokens * t

    def break_even(self) -> float:
        """The acceptance below which a draft costs more to verify than its accepted tokens save."""
        t = self.token_seconds()
        if t is None or self.verify_token is None or t <= 0:
            return PRIOR_VERIFY_RATIO
        return min(1.0, self.verify_token / t)

    def saving(self, acceptance: float, draft_len: int, prophet_token: float | None = None) -> float | None:
        """Expected seconds a draft of ``draft_len`` saves the agent: accepted tokens it need not
        decode, less the verification. None when the costs are not known yet."""
        t, v = self.token_seconds(prophet_token), self.verify_seconds(draft_len, prophet_token)
        if t is None or v is None:
            return None
        return acceptance * draft_len * t - v


@dataclass(frozen=True)
class Plan:
    """Whether a mode drafts this round, and how many tokens (decided by :class:`Adaptive`)."""

    use: bool
    draft_len: int
    note: str = ""  # what the rule decided and why, for the events ("" when nothing changed)
    reason: str = "low_acceptance"  # why not, when not ``use``: "low_acceptance" | "not_ready"


class Fitter:
    """Prepared drafts fitted to the time before their hook: the measured lead time plus the wait a
    draft's saving pays for. Shorter when only part fits; none (reason "not_ready", no prophet work)
    when fewer than ``MIN_DRAFT_LEN`` tokens would be ready, except for a short probe after
    ``PROBE_EVERY`` such skips in a row (costs change: the machine may be less busy), the gap doubling
    up to ``MAX_PROBE_GAP`` while no draft is used and accepted (:meth:`accepted`)."""

    def __init__(self) -> None:
        self.late: dict[str, int] = {}  # mode -> prepared drafts skipped in a row for not fitting in time
        self.gaps: dict[str, int] = {}  # mode -> skips before the next probe (absent: PROBE_EVERY)

    def fit(self, mode: str, plan: Plan, costs: Costs, acceptance: float, *, ahead: float,
            new_image: bool) -> tuple[Plan, float | None]:
        """``plan`` fitted, and the prophet seconds it queues for the drafts after it (None when nothing
        is measured yet, or it is skipped). ``ahead``: seconds of the drafts queued before it;
        ``new_image``: its prompt starts with an image the prophet has not read."""
        c = costs
        lead, per_tok = c.lead.get(mode), c.prophet_seconds()
        full = c.draft_seconds(plan.draft_len, new_image=new_image)
        if lead is None or per_tok is None or full is None or per_tok <= 0:
            return plan, None  # nothing measured yet: draft, and measure
        wait = max(0.0, c.saving(acceptance, plan.draft_len) or 0.0)
        prompt = full - plan.draft_len * per_tok
        fits = int((lead + wait - ahead - prompt) / per_tok)
        if fits < min(MIN_DRAFT_LEN, plan.draft_len):
            self.late[mode] = self.late.get(mode, 0) + 1
            gap = self.gaps.get(mode, PROBE_EVERY)
            if self.late[mode] < gap:
                return Plan(False, 0,
                            f"not drafted: it needs ~{full * 1e3:.0f} ms, "
                            f"the agent gets there in ~{lead * 1e3:.0f} ms", reason="not_ready"), None
            # a short probe; the next one comes twice as late unless a draft is used meanwhile
            self.gaps[mode] = min(2 * gap, MAX_PROBE_GAP)
            fits, note = min(MIN_DRAFT_LEN,
                             plan.draft_len), f"probing whether a {mode} draft is ready in time"
        else:
            note = plan.note
        self.late[mode] = 0
        if fits < plan.draft_len:
            plan = Plan(True, fits,
                        (note + "; " if note else "") + f"L_d {fits} of {plan.draft_len}: what is ready "
                        f"in the ~{lead * 1e3:.0f} ms before the agent needs it")
        elif note != plan.note:
            plan = Plan(True, plan.draft_len, note)
        return plan, c.draft_seconds(plan.draft_len, new_image=new_image) or 0.0

    def accepted(self, mode: str) -> None:
        """A draft of ``mode`` was ready and accepted: probe at the normal rate again."""
        self.gaps.pop(mode, None)


class Adaptive:
    """Per-mode acceptance over the chat's last ``WINDOW`` rounds, and what follows from it.

    - off: after at least ``MIN_ROUNDS_TO_SWITCH_OFF`` rounds whose acceptance is below break-even
      (:meth:`Costs.break_even`), the mode does not draft; every ``PROBE_EVERY``-th skipped round it
      drafts once again, so a mode whose drafts become good comes back.
    - shorter drafts: L_d = clamp(ceil(2 x mean accepted tokens per round) + 2, MIN_DRAFT_LEN,
      draft_len): the prophet stops drafting tokens that would be rejected (and verifying costs less).
    ``enabled=False`` pins L_d and never switches a mode off (experiments, ``eval``).
    """

    def __init__(self, draft_len: int, *, enabled: bool = True) -> None:
        self.draft_len = draft_len
        self.enabled = enabled
        self.rounds: dict[str, list[tuple[int, int]]] = {m: [] for m in DRAFT_MODES}  # (drafted, accepted)
        self.off_skips: dict[str, int] = dict.fromkeys(DRAFT_MODES, 0)

    def acceptance(self, mode: str) -> float:
        r = self.rounds[mode]
        drafted = sum(d for d, _ in r)
        return sum(a for _, a in r) / drafted if drafted else PRIOR_ACCEPTANCE

    def record(self, mode: str, drafted: int, accepted: int) -> None:
        if drafted:
            self.rounds[mode] = (self.rounds[mode] + [(drafted, accepted)])[-WINDOW:]
            self.off_skips[mode] = 0

    def plan(self, mode: str, costs: Costs) -> Plan:
        if not self.enabled:
            return Plan(True, self.draft_len)
        r = self.rounds[mode]
        acc, be = self.acceptance(mode), costs.break_even()
        if len(r) >= MIN_ROUNDS_TO_SWITCH_OFF and acc < be:
            if self.off_skips[mode] + 1 < PROBE_EVERY:
                return Plan(False, 0, f"{mode} drafts off: acceptance {acc:.2f} is below break-even {be:.2f}")
            probe = True
        else:
            probe = False
        n = self.draft_len
        if r:
            mean_acc = sum(a for _, a in r) / len(r)
            n = max(MIN_DRAFT_LEN, min(self.draft_len, math.ceil(2 * mean_acc) + 2))
        note = f"probing {mode} drafts again (acceptance {acc:.2f})" if probe else ""
        if n < self.draft_len:
            note = (note + "; " if note
                    else "") + f"L_d {n} of {self.draft_len} (recent acceptance {acc:.2f})"
        return Plan(True, n, note)

    def skipped(self, mode: str) -> None:
        self.off_skips[mode] += 1


def prophet_threads(agent_threads: int, cores: int) -> int:
    """Threads for the prophet, which drafts while the agent decodes: the cores the agent's decoding
    leaves free, at least 1, at most half the machine. On 2 cores (agent decodes on 1): 1. More
    threads than cores make llama.cpp's spin-waiting threads stall each other (tens of times slower)."""
    return max(1, min(cores - agent_threads, cores // 2))


KEEP_AT_LEAST = 3  # the agent gives its decoding's cores to the prophet only if it keeps this many


def shared_threads(agent_threads: int, cores: int) -> tuple[int, int]:
    """(agent decode threads, prophet threads): the prophet's from :func:`prophet_threads`; the agent's
    decoding gives up what the prophet needs when it keeps at least ``KEEP_AT_LEAST`` threads (on 8
    cores an agent decoding on 8 threads keeps 7: with many threads decoding is memory-bound and one
    less barely slows it). With fewer it keeps them all, and the prophet computes only while it fits
    beside the agent (``runtime.cores``: while the agent waits for a tool, the network or the person):
    on 2 cores the Qwen3-VL-2B stand-in decodes 79 ms/token with 2 threads and 147 with 1, a loss no
    accepted draft makes up (SeProD reports 1.03-1.07x). A small agent that decodes on 1 thread of 2
    (SmolLM2) leaves the prophet the other: 1 and 1."""
    p = prophet_threads(agent_threads, cores)
    if agent_threads + p <= cores or cores - p < KEEP_AT_LEAST:
        return max(1, agent_threads), p
    return cores - p, p
