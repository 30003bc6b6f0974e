"""``trtspec validate``: a prompt set through the HF reference and a system under test, compared token by token.

Three outputs per prompt, all greedy: the reference (HF ``generate(do_sample=False)`` on the target alone), the
system's speculative output (num_draft_tokens K; None: adaptive K) and the same system's target-only output
(K = 0). Two comparisons: speculative vs reference (may drift under reduced precision: a different kernel path is
a different rounding) and the control, speculative vs target-only on the same system, which must match exactly:
greedy draft-target decoding emits exactly the target's greedy tokens whatever the draft proposes. So does prompt
lookup: the speculative run's ``proposer`` (core/lookup.py; None: the system's own) changes which tokens are
proposed, never the greedy output, and its stats keep acceptance per proposer (``by_proposer``). A system with
a fixed K (``fixed_k``: upstream's LLM-API model, whose model.yaml sets it) has no target-only mode: the control
is then not run (None) and a note says so. Where the speculative output leaves the reference, the reference's logit
margin at that token is recorded (``Divergence``), so rounding at a near-tie can be told from a bug
(docs/exactness.md).

``compare_outputs`` and the ``ValidationResult`` properties are pure; ``run_validation`` does the I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from trtspec.core.metrics import AcceptanceStats, merge_stats
from trtspec.core.token_rules import comparable_pair
from trtspec.validate.compare import (
    Comparison,
    Divergence,
    compare,
    exact_match_rate,
    mean_agreement,
    token_at,
)
from trtspec.validate.prompts import Prompt
from trtspec.validate.systems import (
    Generation,
    Request,
    SystemUnderTest,
    encode_prompts,
    generate_all,
    speed_withheld,
)


@dataclass
class PromptOutcome:
    """One prompt's three outputs (token ids cut at the first stop token, core/token_rules.py rule 4) and their
    comparisons."""

    prompt: Prompt
    reference: list[int]
    speculative: Generation
    target_only: Generation | None  # None: the system has a fixed K, no target-only run
    vs_reference: Comparison
    control: Comparison | None
    divergence: Divergence | None = None  # from the reference, with its logit margin there (run_validation)
    compared: list[int] = field(default_factory=list)  # the system's ids as compared with ``reference``


@dataclass
class Thresholds:
    """Gates for CI; None = report only. Rates are fractions in [0, 1]."""

    min_exact_match: float | None = None
    min_acceptance: float | None = None
    min_control_match: float | None = 1.0


@dataclass
class ValidationResult:
    system: str
    num_draft_tokens: int | None  # None: adaptive K (each request's own, up to max_draft_len)
    max_new_tokens: int
    outcomes: list[PromptOutcome]
    speculative_wall_s: float
    target_only_wall_s: float
    thresholds: Thresholds = field(default_factory=Thresholds)
    notes: list[str] = field(default_factory=list)
    proposer: str = "draft"  # who proposed the speculative run's draft tokens (core/lookup.py PROPOSERS)

    @property
    def exact_match_rate(self) -> float:
        return exact_match_rate([o.vs_reference for o in self.outcomes])

    @property
    def mean_token_agreement(self) -> float:
        return mean_agreement([o.vs_reference for o in self.outcomes])

    @property
    def control_match_rate(self) -> float | None:
        controls = [o.control for o in self.outcomes]
        return None if None in controls else exact_match_rate(controls)

    @property
    def stats(self) -> AcceptanceStats:
        return merge_stats([o.speculative.stats for o in self.outcomes if o.speculative.stats is not None])

    @property
    def speed_withheld(self) -> str | None:
        """Why no tokens/s is reported (a timed run of too few tokens, systems.speed_withheld), or None."""
        runs = [[o.speculative for o in self.outcomes]]
        if all(o.target_only is not None for o in self.outcomes):
            runs.append([o.target_only for o in self.outcomes])
        return speed_withheld(min(sum(len(g.token_ids) for g in run) for run in runs))

    @property
    def tokens_per_s(self) -> float | None:
        if self.speed_withheld:
            return None
        return _rate(sum(len(o.speculative.token_ids) for o in self.outcomes), self.speculative_wall_s)

    @property
    def target_only_tokens_per_s(self) -> float | None:
        if self.speed_withheld or any(o.target_only is None for o in self.outcomes):
            return None
        return _rate(sum(len(o.target_only.token_ids) for o in self.outcomes), self.target_only_wall_s)

    def failures(self) -> list[str]:
        """One line per threshold that failed (empty = pass)."""
        t, out = self.thresholds, []
        checks = [
            (
                "exact-match rate vs the HF reference",
                self.exact_match_rate,
                t.min_exact_match,
                "--min-exact-match",
            ),
            ("acceptance rate", self.stats.measured_acceptance, t.min_acceptance, "--min-acceptance"),
            (
                "control match rate (speculative vs target-only)",
                self.control_match_rate,
                t.min_control_match,
                "--min-control-match",
            ),
        ]
        for what, value, floor, option in checks:
            if floor is not None and value is not None and value < floor:
                out.append(f"{what} {value:.3f} < {option} {floor:.3f}")
        if t.min_acceptance and self.stats.measured_acceptance is None:  # a floor of 0 asks for nothing
            out.append(
                f"no draft tokens were reported, so acceptance is undefined and --min-acceptance "
                f"{t.min_acceptance:.3f} cannot be met"
            )
        # Whatever the thresholds: a divergence the dtypes' rounding cannot explain means the system computes
        # something other than the target (docs/exactness.md), which no gate setting makes a pass.
        out += [
            f"{o.prompt.id}: {o.divergence.describe()}"
            for o in self.outcomes
            if o.divergence is not None and not o.divergence.near_tie
        ]
        return out


def other_model_note(outcomes: Sequence[PromptOutcome], target: str) -> str | None:
    """A note when no output agrees with the reference even on its first token, over several prompts: the system
    is most likely serving another model (a lower precision diverges later, not at once on every prompt)."""
    if len(outcomes) < 2 or any(o.vs_reference.first_divergence != 0 for o in outcomes):
        return None
    return (
        f"No output agrees with the reference ({target}) even on its first token: the system under test is "
        "probably serving another model than this recipe's target."
    )


def k_label(num_draft_tokens: int | None) -> str:
    """A run's K as reports name it: the number, or "adaptive" for None (each request's own K)."""
    return "adaptive" if num_draft_tokens is None else str(num_draft_tokens)


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def compare_outputs(
    prompts: Sequence[Prompt],
    reference: Sequence[Sequence[int]],
    speculative: Sequence[Generation],
    target_only: Sequence[Generation | None],
    stop_token_ids: Iterable[int],
    to_text_domain: Callable[[list[int]], list[int]] | None = None,
) -> list[PromptOutcome]:
    """Cut every output at its first stop token and compare (core/token_rules.py rule 4: ``comparable_pair``, which
    keeps what a cut would hide). ``to_text_domain`` (ids -> ids) maps the reference the way a text-only system's
    output was mapped (detokenise, then tokenise), so both sides compare alike."""
    stops = set(stop_token_ids)
    outcomes = []
    for prompt, ref, spec, base in zip(prompts, reference, speculative, target_only, strict=True):
        ref_ids, spec_ids = comparable_pair(ref, spec.token_ids, stops)
        if spec.ids_from_text and to_text_domain is not None:
            ref_ids = to_text_domain(ref_ids)
        control = None
        if base is not None:  # both runs as compared with the reference, so either's overrun shows
            control = compare(comparable_pair(ref, base.token_ids, stops)[1], spec_ids)
        vs_reference = compare(ref_ids, spec_ids)
        outcomes.append(PromptOutcome(prompt, ref_ids, spec, base, vs_reference, control, compared=spec_ids))
    return outcomes


def divergence_of(
    outcome: PromptOutcome, request: Request, reference, system_dtype: str | None = None
) -> Divergence | None:
    """Where the system's output first leaves the reference, with the reference's logit margin there, so rounding
    at a near-tie can be told from a bug. None when they match, or for ids taken from text (no such position)."""
    index = outcome.vs_reference.first_divergence
    if index is None or outcome.speculative.ids_from_text:
        return None
    candidate = outcome.compared
    if index >= len(outcome.reference) and token_at(candidate, index) in reference.stop_token_ids():
        # it stopped where the reference did, then went on: no choice of the reference's differs, so no margin
        # can excuse it (comparable_pair keeps what follows the stop)
        margin = math.inf
    else:
        margin = reference.margin(request.token_ids, index)
    return Divergence(
        index,
        token_at(outcome.reference, index),
        token_at(candidate, index),
        margin,
        reference.dtype,
        system_dtype,
    )


def warm_up(system: SystemUnderTest, request: Request, params, target_only: bool = True) -> None:
    """One short request in both modes, so the timed runs do not pay first-call costs (allocations, caches)."""
    short = params.with_(max_new_tokens=min(4, params.max_new_tokens))
    system.generate([request], short)
    if target_only:
        system.generate([request], short.with_(num_draft_tokens=0))


def run_validation(
    system: SystemUnderTest,
    reference,
    prompts: Sequence[Prompt],
    *,
    max_new_tokens: int,
    num_draft_tokens: int | None = None,
    thresholds: Thresholds | None = None,
    progress: Callable[[str], None] | None = None,
    proposer: str | None = None,
) -> ValidationResult:
    """Reference (``validate.reference.HFReference``), then the system speculative and target-only; compare.
    ``proposer``: the speculative requests' own (None: the system's default, ``system.proposer``)."""
    from trtspec.engines.sampling import SamplingParams

    tokenizer = reference.tokenizer
    requests = encode_prompts(tokenizer, prompts)
    say = progress or (lambda _msg: None)
    say(f"HF reference on {len(prompts)} prompts")
    ref_ids = [reference.generate(r.token_ids, max_new_tokens) for r in requests]
    params = SamplingParams(
        max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens, proposer=proposer
    )
    proposer = proposer or getattr(system, "proposer", "draft")  # a wrapper of a system may not say
    fixed_k = system.fixed_k
    warm_up(system, requests[0], params, target_only=fixed_k is None)
    say(f"{system.name}: speculative, num_draft_tokens={k_label(num_draft_tokens)}, proposer {proposer}")
    speculative, spec_wall = generate_all(system, requests, params)
    notes = []
    if fixed_k is None:
        say(f"{system.name}: target-only")
        target_only, base_wall = generate_all(system, requests, params.with_(num_draft_tokens=0))
    else:
        target_only, base_wall = [None] * len(requests), 0.0
        notes.append(
            f"The system drafts a fixed K={fixed_k} (set in its model.yaml) and has no per-request target-only "
            "mode: the control run and its threshold were skipped; outputs are compared with the HF reference."
        )

    def to_text_domain(ids: list[int]) -> list[int]:
        return tokenizer(tokenizer.decode(ids, skip_special_tokens=True), add_special_tokens=False).input_ids

    outcomes = compare_outputs(
        prompts, ref_ids, speculative, target_only, reference.stop_token_ids(), to_text_domain
    )
    outcomes = [
        replace(o, divergence=divergence_of(o, r, reference, getattr(system, "dtype", None)))
        for o, r in zip(outcomes, requests, strict=True)
    ]
    notes += [f"{o.prompt.id}: {o.divergence.describe()}" for o in outcomes if o.divergence is not None]
    if any(g.ids_from_text for g in speculative):
        notes.append(
            "The system returns text only: its token ids come from tokenising text_output with the target's "
            "tokenizer, and the reference is detokenised and retokenised the same way before comparing."
        )
    result = ValidationResult(
        system.name,
        num_draft_tokens,
        max_new_tokens,
        outcomes,
        spec_wall,
        base_wall,
        thresholds or Thresholds(),
        notes,
        proposer,
    )
    if result.speed_withheld:
        result.notes.append(result.speed_withheld)
    return result
