"""The one engine-call round (engines/engine_calls.py) in the one loop, replayed over scripted or toy draft and
target engines (tensorrtllm_backend's all_models/tests/test_decode.py style): what both of its adapters, the
TensorRT-LLM runner and the orchestrator's BLS calls, run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toy_engines import toy_draft, toy_greedy, toy_target

from trtspec.core.errors import RequestError
from trtspec.core.token_rules import EngineStops
from trtspec.engines.engine_calls import Draft, EngineCallRounds, one_after_the_other
from trtspec.engines.loop import GenerationLoop
from trtspec.engines.rounds import Row
from trtspec.engines.sampling import SamplingParams

END = 2


class FnCalls:
    """EngineCalls over two functions of one sequence, ``draft(tokens, k, round) -> (ids, logits)`` and
    ``target(tokens, draft_ids, draft_logits, round) -> new ids``; ``round``: the verifications so far, so a
    draft asked for beside round r's verification (drafted ahead) is round r + 1's."""

    def __init__(self, draft, target, draft_vocab: int = 0, target_logit_rows: int = 0):
        self.draft, self.target = draft, target
        self.draft_vocab, self.target_logit_rows = draft_vocab, target_logit_rows
        self.verified = 0
        self.calls: list[tuple] = []

    def propose(self, prefixes, num_tokens, call, want_logits):
        self.calls.append(("propose", [list(p) for p in prefixes], num_tokens, call))
        return [Draft(*map(_list, self.draft(list(p), num_tokens, self.verified))) for p in prefixes]

    def verify(self, prefixes, drafts, draft_logits, max_new_tokens, call):
        self.calls.append(("verify", [list(p) for p in prefixes], drafts, max_new_tokens, call))
        index, self.verified = self.verified, self.verified + 1
        return [
            list(
                self.target(
                    list(p), drafts[b] if drafts else [], draft_logits[b] if draft_logits else None, index
                )
            )
            for b, p in enumerate(prefixes)
        ]


def _list(value):
    return list(value) if isinstance(value, list | tuple) else value


class Script:
    """Replays scripted draft and target answers, one per round, and records how each was called."""

    def __init__(self, drafts: list[list[int]], targets: list[list[int]]):
        self.drafts, self.targets = drafts, targets
        self.draft_calls: list[tuple[list[int], int]] = []
        self.target_calls: list[tuple[list[int], list[int]]] = []

    def draft(self, tokens, k, round_index):
        self.draft_calls.append((list(tokens), k))
        return self.drafts[round_index], None

    def target(self, tokens, draft_tokens, draft_logits, round_index):
        self.target_calls.append((list(tokens), list(draft_tokens)))
        return self.targets[round_index]


def _speculate(
    prompt,
    draft,
    target,
    *,
    max_tokens=100,
    num_draft_tokens=3,
    max_seq_len=1000,
    end_ids=(END,),
    stop_ids=(),
    first_token_alone=False,
    draft_ahead=None,
    together=one_after_the_other,
    use_draft_logits=False,
    keep_end=False,
):
    """One request through the round in the loop, as the orchestrator runs it (request.to_job's terms: max_tokens
    capped to max_seq_len, end ids left out unless ``keep_end``); its events, one per round."""
    prompt = list(prompt)
    params = SamplingParams(
        max_new_tokens=max(min(max_tokens, max_seq_len - len(prompt)), 1), num_draft_tokens=num_draft_tokens
    )
    rounds = EngineCallRounds(
        FnCalls(draft, target),
        max_draft_len=4,
        num_slots=1,
        max_seq_len=max_seq_len,
        use_draft_logits=use_draft_logits,
        target_only_in_one_call=False,
        draft_ahead=draft_ahead,
        together=together,
    )
    loop = GenerationLoop(rounds, max_seq_len=max_seq_len, first_token_alone=first_token_alone)
    loop.add(0, prompt, params, eos_ids=end_ids, keep_end=keep_end, stop_sequences=stop_ids)
    events = []
    while loop.busy:
        events += loop.step()
    return events


def _run(script: Script, prompt=(10, 11), **kwargs):
    return _speculate(prompt, script.draft, script.target, **kwargs)


def test_rounds_emit_accepted_plus_one_and_count_accepted_and_bonus_tokens():
    # round 0: 2 of 3 accepted + recovered 9 (the target's surplus 99 is not this round's output);
    # round 1: all 3 accepted + bonus 8; round 2: 1 draft (budget), rejected, recovered 30; round 3: plain step
    script = Script(
        drafts=[[5, 6, 7], [20, 21, 22], [40, 41, 42]],
        targets=[[5, 6, 9, 99], [20, 21, 22, 8], [30, 99], [50]],
    )
    rounds = _run(script, max_tokens=9)
    stats = rounds[-1].stats
    assert [r.new_tokens for r in rounds] == [[5, 6, 9], [20, 21, 22, 8], [30], [50]]
    assert [(r.num_draft, r.num_accepted) for r in rounds] == [(3, 2), (3, 3), (1, 0), (0, 0)]
    assert [r.finished for r in rounds] == [False, False, False, True]
    assert rounds[-1].result.finish_reason == "length"
    # the target verifies the growing sequence; later rounds draft only what the budget leaves room for
    assert script.target_calls[1] == ([10, 11, 5, 6, 9], [20, 21, 22])
    assert script.draft_calls[2] == ([10, 11, 5, 6, 9, 20, 21, 22, 8], 1)
    assert len(script.draft_calls) == 3 and script.target_calls[3][1] == []
    assert (stats.drafted, stats.accepted, stats.bonus_tokens, stats.rounds) == (7, 5, 1, 3)
    assert stats.accepted_length_histogram == [1, 0, 1, 1]
    assert stats.generated_tokens == 9 and stats.target_forwards == 4
    assert stats.acceptance_rate == pytest.approx(5 / 7)


def test_end_id_stops_without_emitting_it():
    script = Script(drafts=[[5, 6, 7], [1, 1, 1]], targets=[[5, END, 7, 8], [1, 1, 1, 1]])
    rounds = _run(script)
    assert [r.new_tokens for r in rounds] == [[5]]
    assert rounds[-1].finished and rounds[-1].result.finish_reason == "stop"
    assert len(script.target_calls) == 1


@pytest.mark.parametrize(
    "draft, answer, emitted",
    [
        ([5, 6, 7], [5], [5]),  # the target's own token at the first mismatch is its end token
        ([5, 6, 7], [5, 6, 7], [5, 6, 7]),  # every draft token accepted, then the end token as the bonus
        ([END, 6, 7], [], []),  # an accepted draft end token: it ends the request there too
    ],
)
@pytest.mark.parametrize("keep_end", [False, True])
def test_an_end_token_the_engine_leaves_out_ends_the_request_in_that_round(draft, answer, emitted, keep_end):
    # TensorRT-LLM counts the end token in no sequence length, so a verification that ends the request returns no
    # target token after the accepted ones; another round would draw that position again.
    script = Script(drafts=[draft, [1, 1, 1]], targets=[answer, [1, 1, 1, 1]])
    rounds = _run(script, keep_end=keep_end)
    assert [r.new_tokens for r in rounds] == [emitted + [END] * keep_end]
    assert rounds[-1].result.finish_reason == "stop" and len(script.target_calls) == 1


def test_a_plain_step_or_a_whole_budget_cut_short_by_a_left_out_end_token_ends_at_it():
    script = Script(drafts=[], targets=[[]])
    rounds = _run(script, num_draft_tokens=0, keep_end=True)
    assert [r.new_tokens for r in rounds] == [[END]] and rounds[-1].result.finish_reason == "stop"
    rounds = EngineCallRounds(
        FnCalls(None, lambda tokens, *_: [7, 8]), max_draft_len=4, num_slots=1, max_seq_len=100
    )
    loop = GenerationLoop(rounds, max_seq_len=100)
    loop.add(0, [10, 11], SamplingParams(max_new_tokens=5, num_draft_tokens=0), eos_ids=(END,), keep_end=True)
    (event,) = loop.step()
    assert event.new_tokens == [7, 8, END] and event.result.finish_reason == "stop"


def test_any_id_of_an_eos_list_stops():
    """Llama 3 Instruct ends at any of [128001, 128008, 128009]; TensorRT-LLM's engines take one end_id."""
    script = Script(drafts=[[5, 6, 7]], targets=[[5, 6, 42, 8]])
    rounds = _run(script, end_ids=(END, 42))
    assert [r.new_tokens for r in rounds] == [[5, 6]] and rounds[-1].result.finish_reason == "stop"


def test_stop_sequence_across_rounds_is_emitted_and_stops():
    # stop word [6, 9]: its first token ends round 0, the second arrives in round 1
    script = Script(drafts=[[5, 1, 1], [9, 4, 4]], targets=[[5, 6], [9, 4, 4, 4]])
    rounds = _run(script, stop_ids=[[6, 9]])
    assert [r.new_tokens for r in rounds] == [[5, 6], [9]]
    assert rounds[-1].result.finish_reason == "stop"


def test_max_tokens_truncates_the_last_round_and_leaves_room_for_the_target_token():
    script = Script(drafts=[[5, 6, 7], [8]], targets=[[5, 6, 7, 4], [8, 3]])
    rounds = _run(script, max_tokens=5)
    assert sum(len(r.new_tokens) for r in rounds) == 5
    assert [r.new_tokens for r in rounds] == [[5, 6, 7, 4], [8]]
    assert len(script.draft_calls) == 1  # budget 1: no draft call at all
    assert script.target_calls[1][1] == []  # a plain target step
    assert rounds[-1].result.finish_reason == "length"


def test_max_seq_len_ends_generation():
    script = Script(drafts=[[5, 6]], targets=[[5, 6, 7]])
    rounds = _run(script, prompt=(1, 1, 1), max_seq_len=6)
    assert [r.new_tokens for r in rounds] == [[5, 6, 7]]
    assert script.draft_calls[0][1] == 2  # budget 3 leaves 2 draft tokens + the target's own
    assert rounds[-1].finished and rounds[-1].result.finish_reason == "length"


def test_target_without_new_tokens_ends_as_it_cannot_progress():
    rounds = _run(Script(drafts=[[5, 6, 7]], targets=[[]]))
    assert len(rounds) == 1 and rounds[0].result.finish_reason == "stop" and rounds[0].new_tokens == []


def test_surplus_draft_and_target_tokens_are_ignored():
    script = Script(drafts=[[5, 6, 7, 8, 9]], targets=[[5, 6, 7, 1, 77, 78]])
    rounds = _run(script, max_tokens=4)
    assert rounds[0].new_tokens == [5, 6, 7, 1] and rounds[0].num_draft == 3


def test_k_zero_is_plain_target_decoding():
    script = Script(drafts=[], targets=[[5], [6], [7]])
    rounds = _run(script, num_draft_tokens=0, max_tokens=3)
    assert [r.new_tokens for r in rounds] == [[5], [6], [7]] and script.draft_calls == []


def test_first_token_alone_takes_round_zero_from_the_target_prefill_then_drafts():
    script = Script(drafts=[[], [6, 7, 8]], targets=[[5], [6, 7, 9, 99]])  # indexed by round
    rounds = _run(script, max_tokens=4, first_token_alone=True)
    stats = rounds[-1].stats
    assert [r.new_tokens for r in rounds] == [[5], [6, 7, 9]] and rounds[-1].result.finish_reason == "length"
    assert script.target_calls[0] == ([10, 11], []) and script.draft_calls == [([10, 11, 5], 2)]
    # the prefill round counts as a target forward, not as a drafting round
    assert (stats.rounds, stats.target_forwards, stats.drafted, stats.accepted) == (1, 2, 2, 2)


@pytest.mark.parametrize("draft_ahead", [False, True])
@pytest.mark.parametrize("first_token_alone", [False, True])
@pytest.mark.parametrize("draft_kind", ["same_as_target", "every_third_wrong", "always_wrong"])
def test_output_equals_plain_greedy_whatever_the_draft(draft_kind, first_token_alone, draft_ahead):
    prompt = [4, 9, 12]
    rounds = _speculate(
        prompt,
        toy_draft(draft_kind),
        toy_target,
        max_tokens=23,
        num_draft_tokens=4,
        first_token_alone=first_token_alone,
        draft_ahead=(lambda: True) if draft_ahead else None,
    )
    stats = rounds[-1].stats
    assert [t for r in rounds for t in r.new_tokens] == toy_greedy(prompt, 23)
    expected_rate = {"same_as_target": 1.0, "always_wrong": 0.0}.get(draft_kind)
    if expected_rate is None:
        assert 0 < stats.acceptance_rate < 1
    else:
        assert stats.acceptance_rate == expected_rate
    if draft_kind == "same_as_target":  # 5 tokens per round, the last round trimmed to the budget
        assert [len(r.new_tokens) for r in rounds] == (
            [1, 5, 5, 5, 5, 2] if first_token_alone else [5] * 4 + [3]
        )


class Recorder:
    """The toy draft and target, recording each call; ``together`` records that both ran in one call."""

    def __init__(self, kind: str):
        self.kind_draft = toy_draft(kind)
        self.draft_calls: list[tuple[int, int, int]] = []  # (context length, k, round index)
        self.target_calls = 0
        self.together_calls = 0

    def draft(self, tokens, k, round_index):
        self.draft_calls.append((len(tokens), k, round_index))
        return self.kind_draft(tokens, k, round_index)

    def target(self, tokens, draft_tokens, draft_logits, round_index):
        self.target_calls += 1
        return toy_target(tokens, draft_tokens, draft_logits, round_index)

    def together(self, first, second):
        self.together_calls += 1
        return first(), second()


def _ahead_run(rec: Recorder, ahead=lambda: True, **kwargs):
    options = dict(max_tokens=12, num_draft_tokens=3, max_seq_len=1000, first_token_alone=True) | kwargs
    return _speculate([4, 9, 12], rec.draft, rec.target, draft_ahead=ahead, together=rec.together, **options)


def test_draft_ahead_replaces_the_next_draft_call_when_the_draft_and_its_bonus_guess_are_accepted():
    rec = Recorder("same_as_target")
    rounds = _ahead_run(rec)
    assert [t for r in rounds for t in r.new_tokens] == toy_greedy([4, 9, 12], 12)
    # round 0 (the prefill) drafts nothing ahead (it would slow the first token); round 1 drafts K = 3 itself and
    # K + 1 = 4 ahead as round 2's draft, whose guess is right, and so on; the last round (budget 3)
    # has no room for a next one and drafts nothing ahead
    assert [len(r.new_tokens) for r in rounds] == [1, 4, 4, 3]
    assert rec.draft_calls == [(4, 3, 1), (8 - 1, 4, 2), (12 - 1, 4, 3)]
    assert rec.target_calls == 4 and rec.together_calls == 2


def test_draft_ahead_that_misses_falls_back_to_a_fresh_draft_from_the_verified_tokens():
    rec = Recorder("always_wrong")
    rounds = _ahead_run(rec)
    assert [t for r in rounds for t in r.new_tokens] == toy_greedy([4, 9, 12], 12)
    ahead = [c for c in rec.draft_calls if c[1] == 4]
    fresh = [c for c in rec.draft_calls if c[1] < 4]
    # every round after the prefill drafts afresh from the verified sequence (one token longer each round)
    assert [length for length, _, _ in fresh] == list(range(4, 4 + len(fresh)))
    assert len(fresh) == sum(1 for r in rounds if r.num_draft)
    assert len(ahead) == rec.together_calls > 0


@pytest.mark.parametrize("ahead", [None, lambda: False])
def test_no_draft_ahead_when_off_or_while_other_requests_run(ahead):
    rec = Recorder("same_as_target")
    rounds = _ahead_run(rec, ahead=ahead)
    assert [t for r in rounds for t in r.new_tokens] == toy_greedy([4, 9, 12], 12)
    assert rec.together_calls == 0 and all(k <= 3 for _, k, _ in rec.draft_calls)


@pytest.mark.parametrize("first_token_alone", [False, True])
@pytest.mark.parametrize("max_seq_len", range(9, 19))
def test_draft_ahead_stays_within_max_seq_len(max_seq_len, first_token_alone):
    rec = Recorder("same_as_target")
    rounds = _ahead_run(rec, max_seq_len=max_seq_len, max_tokens=100, first_token_alone=first_token_alone)
    assert all(length + k <= max_seq_len for length, k, _ in rec.draft_calls)
    assert rounds[-1].result.finish_reason == "length"
    assert 3 + sum(len(r.new_tokens) for r in rounds) == max_seq_len


def test_no_draft_ahead_without_drafts():
    rec = Recorder("same_as_target")
    _ahead_run(rec, num_draft_tokens=0)
    assert rec.draft_calls == [] and rec.together_calls == 0


def test_draft_ahead_passes_the_guess_logits_on_to_the_next_verification():
    vocab = 60
    verified_logits = []

    def draft(tokens, k, round_index):
        ids = toy_greedy(tokens, k)
        logits = np.zeros((k, vocab), dtype=np.float32)
        logits[np.arange(k), ids] = 1.0  # one-hot rows, so each row names its token
        return ids, logits

    def target(tokens, draft_tokens, draft_logits, round_index):
        if draft_tokens:
            verified_logits.append((list(draft_tokens), draft_logits.argmax(-1).tolist()))
        return toy_target(tokens, draft_tokens, draft_logits, round_index)

    _speculate(
        [4, 9, 12],
        draft,
        target,
        max_tokens=12,
        max_seq_len=100,
        first_token_alone=True,
        draft_ahead=lambda: True,
        use_draft_logits=True,
    )
    assert verified_logits and all(ids == rows for ids, rows in verified_logits)


# ---------------------------------------------------------------- the round over a batch (the runner's use)


def _batch_rounds(calls, **options) -> EngineCallRounds:
    settings = dict(max_draft_len=4, num_slots=4, max_seq_len=100, tokenizer_eos=END) | options
    return EngineCallRounds(calls, **settings)


def test_a_batch_drafts_in_one_call_verifies_in_one_call_and_steps_rows_without_drafts_plainly():
    calls = FnCalls(toy_draft("every_third_wrong"), toy_target)
    rows = [Row([4, 9, 12], 0, max_len=50), Row([5, 6], 1, max_len=50), Row([7], 2, max_len=50)]
    outcomes = _batch_rounds(calls).run(rows, [3, 2, 0], SamplingParams(num_draft_tokens=3), None)
    kinds = [(c[0], len(c[1])) for c in calls.calls]
    assert kinds == [("propose", 2), ("verify", 2), ("verify", 1)]  # drafts, verification, one plain step
    assert calls.calls[0][2] == 3 and calls.calls[2][2] is None and calls.calls[2][3] == 1
    for row, start, out in zip(rows, ([4, 9, 12], [5, 6], [7]), outcomes, strict=True):
        assert row.tokens == start + out.tokens and out.tokens == toy_greedy(start, len(out.tokens))
    assert [o.num_draft for o in outcomes] == [3, 2, 0]


def test_a_request_pinned_to_target_only_gets_its_whole_budget_in_one_plain_call():
    calls = FnCalls(toy_draft("same_as_target"), lambda tokens, d, lg, r: toy_greedy(tokens, 5))
    rows = [Row([4, 9], 0, max_len=7), Row([3], 1, max_len=4)]
    outcomes = _batch_rounds(calls).run(rows, [0, 0], SamplingParams(num_draft_tokens=0), None)
    assert [c[0] for c in calls.calls] == ["verify"] and calls.calls[0][3] == 5  # the larger budget
    assert [len(o.tokens) for o in outcomes] == [5, 3]  # each row cut to its own budget


def test_rows_that_stop_differently_go_in_calls_of_their_own_with_end_id_and_stop_words():
    """TensorRT-LLM takes one end_id per call: Llama-3-Instruct's rows (stop ids 128001, 128008, 128009 and the
    tokenizer's eos 128009) get end_id 128009 and the others as one-token stop words; a request with its own
    end_id gets that alone."""
    calls = FnCalls(toy_draft("same_as_target"), toy_target)
    llama3 = (128001, 128008, 128009)
    rows = [Row([4], 0, max_len=9, stop_ids=llama3), Row([5], 1, max_len=9, stop_ids=(7,))]
    _batch_rounds(calls, tokenizer_eos=128009, pad_id=0).run(rows, [2, 2], SamplingParams(), None)
    stops = [c[3].stops for c in calls.calls if c[0] == "propose"]
    assert stops == [
        EngineStops(128009, 0, ((128001,), (128008,))),
        EngineStops(7, 0, ()),
    ]


def test_draft_and_target_get_different_seeds_in_a_round_new_ones_each_round_and_the_same_for_one_seed():
    def seeds(seed):
        calls = FnCalls(toy_draft("same_as_target"), toy_target)
        rounds = _batch_rounds(calls)
        generator = torch.Generator().manual_seed(seed)
        params = SamplingParams(temperature=0.8, seed=seed, num_draft_tokens=2)
        row = Row([4, 9], 0, max_len=20)
        for _ in range(2):
            rounds.run([row], [2], params, generator)
        return [c[-1].seed for c in calls.calls]

    d0, t0, d1, t1 = seeds(7)
    assert len({d0, t0, d1, t1}) == 4 and seeds(7) == [d0, t0, d1, t1] and seeds(8) != [d0, t0, d1, t1]
    greedy = FnCalls(toy_draft("same_as_target"), toy_target)
    _batch_rounds(greedy).run([Row([4], 0, max_len=9)], [2], SamplingParams(), None)
    assert all(c[-1].seed is None for c in greedy.calls)


def test_a_padded_vocabulary_drafts_ids_are_mapped_and_its_logits_padded_to_the_targets_rows():
    """Qwen2.5's pair: the draft has 336 rows, the target 352. A target id the draft lacks (a padding row an
    untrained target samples) reaches the draft as its own last row; its logits reach the target padded with
    -inf (probability 0)."""
    sent = {}

    def draft(tokens, k, r):
        sent["draft_prefix"] = tokens
        return [5] * k, torch.zeros(k, 336)

    def target(tokens, draft_tokens, logits, r):
        sent["logits"] = logits
        return list(draft_tokens) + [6]

    calls = FnCalls(draft, target, draft_vocab=336, target_logit_rows=352)
    rows = [Row([1, 40, 340, 41], 0, max_len=20)]
    rounds = _batch_rounds(calls, use_draft_logits=True)
    (out,) = rounds.run(rows, [3], SamplingParams(temperature=0.9, num_draft_tokens=3), torch.Generator())
    assert sent["draft_prefix"] == [1, 40, 335, 41] and rows[0].tokens[2] == 340
    assert sent["logits"].shape == (3, 352) and torch.isinf(sent["logits"][:, 336:]).all()
    assert out.tokens == [5, 5, 5, 6] and out.num_accepted == 3


def test_a_failed_draft_ahead_is_a_miss_and_the_next_round_drafts_afresh():
    """The orchestrator answers a failed draft-ahead call with no draft ([]): the round keeps its verified tokens and
    the next round calls the draft as usual."""
    rec = Recorder("same_as_target")

    def together_failing_ahead(first, second):
        rec.together_calls += 1
        return first(), []

    rounds = _speculate([4, 9, 12], rec.draft, rec.target, max_tokens=12, draft_ahead=lambda: True,
                        together=together_failing_ahead, first_token_alone=True)  # fmt: skip
    assert [t for r in rounds for t in r.new_tokens] == toy_greedy([4, 9, 12], 12)
    assert rec.together_calls > 0 and all(k <= 3 for _, k, _ in rec.draft_calls)  # every draft is a fresh one


def test_a_row_moved_to_a_freed_slot_keeps_what_the_draft_engine_saw_of_it():
    """The loop compacts its rows (rounds.Rounds.move): the row's per-slot state follows it, so its draft is not
    re-fed the whole row, and the slot it left holds nothing for its next row."""
    rounds = _batch_rounds(FnCalls(toy_draft("every_third_wrong"), toy_target))
    rows = [Row([4, 9, 12], 0, max_len=50), Row([5, 6], 1, max_len=50), Row([7, 8, 9, 10], 2, max_len=50)]
    rounds.run(rows, [3, 2, 2], SamplingParams(num_draft_tokens=3), None)
    behind = rounds.draft_behind(rows[2])
    assert behind < len(rows[2].tokens)
    rounds.release(0)
    rounds.move(rows[2], 0)
    rows[2].slot = 0
    assert rounds.draft_behind(rows[2]) == behind
    newcomer = Row([3, 3, 3], 2, max_len=50)
    assert rounds.draft_behind(newcomer) == 3


def test_a_sampled_top_k_above_what_tensorrt_llm_keeps_is_refused_before_it_is_queued():
    """The loop refuses a sampled request whose top_k is above its runtime's max_top_k, in one line; TensorRT-LLM
    keeps at most 1024 tokens (TOP_K_MAX) and would clip a larger top_k with a log warning."""
    script = Script(drafts=[[5]], targets=[[5, 6]])
    rounds = EngineCallRounds(
        FnCalls(script.draft, script.target), max_draft_len=4, num_slots=2, max_seq_len=100
    )
    loop = GenerationLoop(rounds, max_seq_len=100)
    sampled = SamplingParams(max_new_tokens=4, temperature=0.8, top_k=1025)
    with pytest.raises(RequestError) as err:
        loop.add(0, [10, 11], sampled)
    assert "top_k 1025 is above the engine's limit 1024" in err.value.message and not loop.busy
    loop.add(1, [10, 11], sampled.with_(top_k=1024))
    loop.add(2, [10, 11], sampled.with_(temperature=0.0))  # greedy: top_k plays no part
    assert loop.busy


def test_a_batched_whole_budget_capped_by_its_longest_row_is_no_end_token():
    """TensorRT-LLM takes one max_new_tokens per call, so the runner caps a batch's by its longest row: a short row
    then gets fewer tokens than its budget without having ended."""
    engine_max = 100

    def target(tokens, draft_ids, draft_logits, round_index):
        return [7] * 40

    class CappedCalls(FnCalls):  # as TrtllmCalls.verify caps a plain call
        def verify(self, prefixes, drafts, draft_logits, max_new_tokens, call):
            cap = min(max_new_tokens, engine_max - max(map(len, prefixes)))
            return [out[:cap] for out in super().verify(prefixes, drafts, draft_logits, cap, call)]

    rounds = EngineCallRounds(CappedCalls(None, target), max_draft_len=4, num_slots=2, max_seq_len=engine_max)
    loop = GenerationLoop(rounds, max_seq_len=engine_max)
    loop.add(
        0, [3] * 90, SamplingParams(max_new_tokens=10, num_draft_tokens=0), eos_ids=(END,), keep_end=True
    )
    loop.add(
        1, [3] * 10, SamplingParams(max_new_tokens=40, num_draft_tokens=0), eos_ids=(END,), keep_end=True
    )
    events = []
    while loop.busy:
        events += loop.step()
    short = [e for e in events if e.request_id == 1]
    assert sum(len(e.new_tokens) for e in short) == 40 and END not in [t for e in short for t in e.new_tokens]
    assert short[-1].result.finish_reason == "length"
