"""The in-flight generation loop (engines/loop.py): requests joining and leaving one running batch, stops, cancel,
per-request K and seeds; scripted rounds for the stop logic, the tiny pair for exact outputs."""

from __future__ import annotations

import os
import threading

import pytest
from test_engine import hf_greedy

from trtspec.core.errors import RequestError
from trtspec.engines.adaptive import KPolicy
from trtspec.engines.loop import GenerationLoop
from trtspec.engines.models import load_causal_lm
from trtspec.engines.rounds import Outcome
from trtspec.engines.sampling import SamplingParams
from trtspec.engines.speculative import TorchRounds, feed, width_groups
from trtspec.triton_repo.models.loop_thread import LoopThread

PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 7, 8], [1, 100], [1, 5, 6, 7, 8, 9]]


def run(loop: GenerationLoop, adds: dict[int, list[tuple]]) -> dict:
    """Step ``loop`` until idle; ``adds[step]`` = (id, prompt, params, options) to add before that step.
    Returns id -> (streamed tokens, result)."""
    streamed, results, step = {}, {}, 0
    while loop.busy or any(s >= step for s in adds):
        for request_id, prompt, params, options in adds.get(step, []):
            loop.add(request_id, prompt, params, **options)
        for event in loop.step():
            streamed.setdefault(event.request_id, []).extend(event.new_tokens)
            if event.finished:
                results[event.request_id] = event.result
        step += 1
    return {i: (streamed.get(i, []), results[i]) for i in results}


# ---------------------------------------------------------------- scripted rounds: the stop logic alone


class ScriptedRounds:
    """A runtime whose round emits each row's next tokens from a script (row b: script[prompt[0]]): all the loop
    needs from a runtime (engines/rounds.py). Where a row is in its script is kept per slot, as a KV cache is, so
    a row whose slot changed without ``move`` would start its script over."""

    num_slots, vocab_size, max_draft_len, has_draft, max_top_k, device = 2, 1000, 4, True, 0, "cpu"
    scripts = {1: [[5, 6, 7], [8, 9], [10, 11, 12]], 2: [[20], [21, 22], [23]]}

    def __init__(self):
        self.released, self.moved = [], []
        self.script_rounds = {}  # slot -> the last script round its row ran

    def run(self, rows, num_draft, params, generator):
        outcomes = []
        for row in rows:
            self.script_rounds[row.slot] = n = self.script_rounds.get(row.slot, -1) + 1
            tokens = self.scripts[row.tokens[0]][n % 3]
            row.tokens += tokens
            outcomes.append(Outcome(tokens, len(tokens) - 1, len(tokens) - 1))
        return outcomes

    def release(self, slot):
        self.released.append(slot)
        self.script_rounds.pop(slot, None)

    def move(self, row, slot):
        self.moved.append((row.slot, slot))
        self.script_rounds[slot] = self.script_rounds.pop(row.slot)

    def draft_behind(self, row):
        return 0  # a scripted draft is always current


@pytest.fixture
def scripted():
    return GenerationLoop(ScriptedRounds(), max_seq_len=64)


def test_eos_lists_stop_sequences_and_max_new_tokens_cut_each_request_on_its_own(scripted):
    long = SamplingParams(max_new_tokens=50)
    got = run(
        scripted,
        {
            0: [
                ("eos-kept", [1], long, {"eos_ids": {99, 8}}),
                ("eos-dropped", [1], long, {"eos_ids": {9, 8}, "keep_end": False}),
            ],
            1: [("sequence", [1], long, {"stop_sequences": [[7, 8]]})],
            2: [("length", [1], SamplingParams(max_new_tokens=4), {})],
        },
    )
    assert got["eos-kept"][1].token_ids == [5, 6, 7, 8] and got["eos-kept"][1].finish_reason == "stop"
    assert got["eos-dropped"][1].token_ids == [5, 6, 7]
    assert got["sequence"][1].token_ids == [5, 6, 7, 8]
    assert got["length"][1].token_ids == [5, 6, 7, 8] and got["length"][1].finish_reason == "length"
    for streamed, result in got.values():
        assert streamed == result.token_ids


def test_requests_wait_for_a_free_slot_and_a_cancelled_one_frees_it(scripted):
    params = SamplingParams(max_new_tokens=50)
    for request_id in ("a", "b", "c"):
        scripted.add(request_id, [1], params)
    first = scripted.step()
    assert {e.request_id for e in first} == {"a", "b"}  # two slots: c waits
    scripted.cancel("a")
    scripted.cancel("c-never-added")
    events = scripted.step()
    cancelled = [e for e in events if e.request_id == "a"]
    assert cancelled[0].result.finish_reason == "cancelled" and cancelled[0].result.token_ids == [5, 6, 7]
    assert {e.request_id for e in events if not e.finished} == {"b", "c"}  # c took a's slot this step
    assert scripted.rounds.released == [0]  # the runtime dropped a's state before c took its slot


def test_a_row_joining_a_freed_slot_runs_in_slot_order_so_the_batch_reads_its_caches_as_views():
    """A batch over consecutive slots in order reads the KV caches as views (models.LeanCausalLM gathers every
    layer's cache otherwise): a joining row takes the lowest free slot, the one a row left below the others, and
    runs in its place, so no row has to move."""
    rounds = ScriptedRounds()
    rounds.num_slots = 3
    seen = []
    run_rows = rounds.run
    rounds.run = lambda rows, *args: (
        seen.append([(r.slot, r.tokens[0]) for r in rows]) or run_rows(rows, *args)
    )
    loop = GenerationLoop(rounds, max_seq_len=64)
    loop.add("short", [1], SamplingParams(max_new_tokens=3))
    for request_id, prompt in (("b", [2]), ("c", [3]), ("joins", [4])):
        loop.add(request_id, prompt, SamplingParams(max_new_tokens=50))
    rounds.scripts = {**rounds.scripts, 3: rounds.scripts[2], 4: rounds.scripts[2]}
    for _ in range(3):
        loop.step()
    assert seen[0] == [(0, 1), (1, 2), (2, 3)] and rounds.released == [0]  # "short" left slot 0 in round one
    assert rounds.moved == []
    assert seen[1:] == [[(0, 4), (1, 2), (2, 3)]] * 2  # "joins" took slot 0 and runs first, not after b and c


def test_a_draining_batch_stays_on_its_lowest_slots():
    """A batch whose rows finish apart, with nothing queued (an engine call's group): after each departure the
    row on the highest slot moves into the hole, so the rows left run on slots 0..n-1, and each row's script goes
    with it (the scripted runtime keeps it per slot). "a" and "c" finish in the same round: "c" does not move into
    the slot "a" leaves."""
    rounds = ScriptedRounds()
    rounds.num_slots = 4
    rounds.scripts = {**rounds.scripts, 3: [[30, 31], [32], [33, 34, 35]]}
    seen = []
    run_rows = rounds.run
    rounds.run = lambda rows, *args: seen.append([r.slot for r in rows]) or run_rows(rows, *args)
    loop = GenerationLoop(rounds, max_seq_len=64)
    budgets = {"a": (50, [2]), "b": (3, [3]), "c": (50, [3]), "d": (6, [2])}
    got = run(
        loop, {0: [(i, prompt, SamplingParams(max_new_tokens=n), {}) for i, (n, prompt) in budgets.items()]}
    )
    assert all(slots == list(range(len(slots))) for slots in seen)
    assert rounds.moved == [(3, 1), (2, 1)]  # "d" into b's slot; then "c" into the slot d left
    for request_id, (budget, prompt) in budgets.items():
        tokens, result = got[request_id]
        script = [t for tokens in rounds.scripts[prompt[0]] for t in tokens]
        assert tokens == result.token_ids == (script * 20)[:budget]


def test_a_cancelled_rows_slot_is_taken_by_the_row_on_the_highest_slot():
    rounds = ScriptedRounds()
    rounds.num_slots = 3
    loop = GenerationLoop(rounds, max_seq_len=64)
    for request_id in ("a", "b", "c"):
        loop.add(request_id, [2], SamplingParams(max_new_tokens=50))
    loop.step()
    loop.cancel("a")
    loop.step()
    assert rounds.released == [0] and rounds.moved == [(2, 0)]
    assert sorted(r.row.slot for r in loop.active) == [0, 1]


def test_rows_of_several_sampling_groups_are_not_moved():
    """Each sampling group runs as a batch of its own: a sampled row moved into a greedy row's hole would split
    the sampled rows' consecutive slots and leave the greedy ones split anyway."""
    rounds = ScriptedRounds()
    rounds.num_slots = 4
    loop = GenerationLoop(rounds, max_seq_len=64)
    loop.add("greedy-short", [2], SamplingParams(max_new_tokens=1))
    loop.add("greedy", [2], SamplingParams(max_new_tokens=50))
    for request_id in ("sampled-1", "sampled-2"):
        loop.add(request_id, [2], SamplingParams(max_new_tokens=50, temperature=0.7, seed=1))
    for _ in range(3):
        loop.step()
    assert rounds.released == [0] and rounds.moved == []
    assert sorted(r.row.slot for r in loop.active) == [1, 2, 3]


def test_a_failed_round_ends_every_request_with_one_line_and_the_thread_keeps_serving(scripted, monkeypatch):
    real_round, failed = GenerationLoop._round, []

    def fail_once(self):
        if not failed:
            failed.append(True)
            raise RuntimeError("kernel failed")
        return real_round(self)

    monkeypatch.setattr(GenerationLoop, "_round", fail_once)
    errors, events, first, done = [], [], threading.Event(), threading.Event()
    thread = LoopThread(scripted, on_error=errors.append)
    try:
        thread.submit("x", [1], SamplingParams(max_new_tokens=3), lambda e: (events.append(e), first.set()))
        assert first.wait(10)
        thread.submit(
            "y",
            [2],
            SamplingParams(max_new_tokens=2),
            lambda e: (events.append(e), e.finished and done.set()),
        )
        assert done.wait(10)
    finally:
        thread.stop()
    assert events[0].error == "internal error: RuntimeError: kernel failed" and errors == [events[0].error]
    assert events[-1].result.token_ids == [20, 21]


def test_a_request_cancelled_in_a_step_that_fails_still_ends_as_cancelled(scripted, monkeypatch):
    """The events a step made before its round (or a move) failed are delivered by fail_all, before the error
    that ends every other request: a client that cancelled gets its "cancelled", not silence."""
    for request_id in ("a", "b"):
        scripted.add(request_id, [1], SamplingParams(max_new_tokens=50))
    scripted.step()
    scripted.cancel("a")

    def kernel_failed(self):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(GenerationLoop, "_round", kernel_failed)
    with pytest.raises(RuntimeError):
        scripted.step()
    events = scripted.fail_all("internal error")
    assert [(e.request_id, e.error or e.result.finish_reason) for e in events] == [
        ("a", "cancelled"),
        ("b", "internal error"),
    ]
    assert scripted.fail_all("again") == []  # nothing is delivered twice


def test_a_failed_move_ends_the_requests_with_the_loops_records_whole():
    rounds = ScriptedRounds()
    rounds.num_slots = 3

    def out_of_memory(row, slot):
        raise RuntimeError("out of memory (simulated)")

    rounds.move = out_of_memory
    loop = GenerationLoop(rounds, max_seq_len=64)
    loop.add("short", [2], SamplingParams(max_new_tokens=1))
    for request_id in ("b", "c"):
        loop.add(request_id, [2], SamplingParams(max_new_tokens=50))
    finished = [e.request_id for e in loop.step() if e.finished]
    assert finished == ["short"]
    with pytest.raises(RuntimeError, match="out of memory"):
        loop.step()  # "c" was to move into slot 0
    assert [r.row.slot for r in loop.active] == [1, 2] and loop.free_slots == [0]
    assert sorted(e.request_id for e in loop.fail_all("internal error")) == ["b", "c"]


def test_the_thread_runs_on_step_once_after_each_steps_events(scripted):
    log, done = [], threading.Event()
    thread = LoopThread(scripted, on_step=lambda: log.append("step"))
    try:
        sink = lambda e: (log.append(e.new_tokens), e.finished and done.set())  # noqa: E731
        thread.submit("x", [1], SamplingParams(max_new_tokens=6), sink)
        assert done.wait(10)
    finally:
        thread.stop()
    assert log == [[5, 6, 7], "step", [8, 9], "step", [10], "step"]


def test_a_failing_consumer_is_logged_and_the_thread_serves_on(scripted):
    errors, done = [], threading.Event()

    def broken(event):
        raise KeyError("no such stream")

    thread = LoopThread(scripted, on_error=errors.append)
    try:
        thread.submit("x", [1], SamplingParams(max_new_tokens=3), broken)
        thread.submit("y", [2], SamplingParams(max_new_tokens=2), lambda e: e.finished and done.set())
        assert done.wait(10)
    finally:
        thread.stop()
    assert errors and errors[0] == "internal error delivering a round: KeyError: 'no such stream'"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning to one of several cores needs two")
def test_the_thread_runs_on_the_cores_it_is_given(scripted):
    core, seen, done = min(os.sched_getaffinity(0)), [], threading.Event()
    thread = LoopThread(scripted, cores={core})
    try:
        sink = lambda e: (seen.append(os.sched_getaffinity(0)), e.finished and done.set())  # noqa: E731
        thread.submit("x", [1], SamplingParams(max_new_tokens=3), sink)
        assert done.wait(10)
    finally:
        thread.stop()
    assert seen == [{core}]


# ---------------------------------------------------------------- the tiny pair: exact outputs


@pytest.fixture(scope="module")
def pair(tiny_pair):
    opts = dict(num_slots=4, max_seq_len=128)
    return load_causal_lm(tiny_pair[0], **opts), load_causal_lm(tiny_pair[1], **opts)


def new_loop(pair, **options) -> GenerationLoop:
    return GenerationLoop(TorchRounds(*pair, max_draft_len=4), max_seq_len=128, **options)


def test_requests_joining_mid_run_get_the_tokens_they_get_alone_and_hf_greedy(pair, tiny_pair):
    ks = [4, 2, 0, 3]
    requests = [
        (i, prompt, SamplingParams(max_new_tokens=10 + 4 * i, num_draft_tokens=k), {})
        for i, (prompt, k) in enumerate(zip(PROMPTS, ks, strict=True))
    ]
    alone = {i: run(new_loop(pair), {0: [r]})[i] for i, r in enumerate(requests)}
    together = run(
        new_loop(pair, first_token_alone=True), {0: requests[:1], 2: requests[1:3], 5: requests[3:]}
    )
    for i, (_, prompt, params, _) in enumerate(requests):
        assert together[i][0] == alone[i][0] == hf_greedy(tiny_pair[0], prompt, params.max_new_tokens)
        assert together[i][1].token_ids == together[i][0]
    assert together[2][1].stats.drafted == 0  # K = 0 for that request only
    assert together[0][1].stats.drafted > 0 and together[1][1].stats.max_draft_len == 2


def spy_forward_shapes(model, monkeypatch) -> list[tuple[int, int]]:
    """The [batch, width] of each of ``model``'s forwards from now on."""
    shapes, forward = [], model.forward

    def spy(tokens, *args):
        shapes.append(tuple(tokens.shape))
        return forward(tokens, *args)

    monkeypatch.setattr(model, "forward", spy)
    return shapes


def test_a_long_prompt_joining_running_rows_is_prefilled_in_a_forward_of_its_own(
    pair, tiny_pair, monkeypatch
):
    shapes = spy_forward_shapes(pair[0], monkeypatch)
    long_prompt = [1] + [(7 * i) % 200 + 10 for i in range(59)]  # no <pad> (3): HF generate would mask it
    eos = {"eos_ids": {2}}  # </s>: where HF generate stops
    short = [
        (i, p, SamplingParams(max_new_tokens=12, num_draft_tokens=3), eos) for i, p in enumerate(PROMPTS[1:])
    ]
    joining = ("long", long_prompt, SamplingParams(max_new_tokens=8, num_draft_tokens=3), eos)
    results = run(new_loop(pair), {0: short, 2: [joining]})
    for request_id, prompt, params, _ in [*short, joining]:
        assert results[request_id][0] == hf_greedy(tiny_pair[0], prompt, params.max_new_tokens), request_id
    # the round it joins: its prompt + 3 drafts alone, the 3 running rows' 4-5 tokens in a forward of their own
    assert (1, len(long_prompt) + 3) in shapes
    assert not any(batch > 1 and width >= len(long_prompt) for batch, width in shapes)


def test_rows_run_as_two_forwards_only_where_that_halves_the_padded_positions():
    assert width_groups([5, 5, 5, 40, 5]) == [[0, 1, 2, 4], [3]]  # 4 x 5 + 40 = 60 <= 5 x 40 / 2
    assert width_groups([10, 16, 32, 11, 19, 10, 16, 32]) == [list(range(8))]  # prompts of similar lengths
    assert width_groups([1, 37]) == [[0, 1]]  # 38 of 74: not half
    assert width_groups([0, 0, 0, 1]) == [[0, 1, 2, 3]]  # a row that feeds nothing still takes one position
    assert width_groups([2, 2, 500, 3, 490]) == [[0, 1, 3], [2, 4]]


def test_rows_that_feed_nothing_in_a_split_step_run_no_forward(pair, monkeypatch):
    target = pair[0]
    calls = spy_forward_shapes(target, monkeypatch)
    long_prompt = [1] + [(5 * i) % 200 + 10 for i in range(39)]
    logits = feed(target, [0, 1, 2, 3], [[1, 7], [1, 8], [1, 9], long_prompt], [2, 2, 2, 0], [1, 1, 1, 1])
    assert calls == [(1, 40)] and logits.shape[0] == 4 and not logits[:3].any()


def test_first_token_alone_drafts_nothing_in_a_round_no_other_row_drafts_in(pair):
    loop = new_loop(pair, first_token_alone=True)
    loop.add("a", PROMPTS[0], SamplingParams(max_new_tokens=8, num_draft_tokens=4))
    (first,) = loop.step()
    assert len(first.new_tokens) == 1 and first.stats.drafted == 0  # alone: the target's prefill only
    loop.add("b", PROMPTS[1], SamplingParams(max_new_tokens=8, num_draft_tokens=4))
    loop.add("c", PROMPTS[2], SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
    events = {e.request_id: e for e in loop.step()}
    assert events["a"].stats.drafted == 4 and events["b"].stats.drafted == 4  # b joins a drafting round
    assert events["c"].stats.drafted == 0  # a seeded row's draws never depend on the others


def test_a_seeded_sampled_request_gives_the_same_tokens_alone_and_beside_others(pair):
    seeded = ("s", PROMPTS[0], SamplingParams(max_new_tokens=16, temperature=1.0, top_k=20, seed=5), {})
    others = [
        ("g", PROMPTS[1], SamplingParams(max_new_tokens=16), {}),
        ("u", PROMPTS[2], SamplingParams(max_new_tokens=16, temperature=1.0, top_k=20), {}),
    ]
    alone = run(new_loop(pair), {0: [seeded]})["s"][0]
    beside = run(new_loop(pair), {0: others, 1: [seeded]})["s"][0]
    other_seed = run(
        new_loop(pair),
        {0: [seeded[:2] + (SamplingParams(max_new_tokens=16, temperature=1.0, top_k=20, seed=6), {})]},
    )
    assert beside == alone and other_seed["s"][0] != alone


def test_a_seeded_requests_probes_do_not_depend_on_the_load(pair):
    """Under a schedule that drafts nothing at 2 in flight, and a draft priced so that no K pays, a seeded
    request's K comes from its probes: it probes by its own rounds (as if alone), so its draws, and so its tokens,
    are the same beside a greedy request."""
    policy = KPolicy(schedule={1: 4, 2: 0}, draft_cost_ratio=0.7)
    seeded = (
        "x",
        PROMPTS[0],
        SamplingParams(max_new_tokens=60, temperature=1.0, seed=3, ignore_eos=True),
        {},
    )
    other = ("o", PROMPTS[1], SamplingParams(max_new_tokens=70, num_draft_tokens=0, ignore_eos=True), {})
    alone = run(new_loop(pair, k_policy=policy), {0: [seeded]})["x"][1]
    beside = run(new_loop(pair, k_policy=policy), {0: [other, seeded]})["x"][1]
    assert alone.stats.drafted > 0  # it probed
    assert beside.token_ids == alone.token_ids and beside.stats.drafted == alone.stats.drafted


def test_stop_strings_need_and_use_the_tokenizer(pair, tiny_pair):
    from transformers import AutoTokenizer

    with pytest.raises(RequestError, match="stop_strings need a tokenizer"):
        new_loop(pair).add("x", PROMPTS[0], SamplingParams(stop_strings=("a",)))
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair[0])
    free = run(new_loop(pair), {0: [("x", PROMPTS[0], SamplingParams(max_new_tokens=20), {})]})["x"][0]
    stop = tokenizer.decode(free[5:7])
    params = SamplingParams(max_new_tokens=20, stop_strings=(stop,))
    _, result = run(new_loop(pair, tokenizer=tokenizer), {0: [("x", PROMPTS[0], params, {})]})["x"]
    assert (
        result.finish_reason == "stop"
        and result.text.endswith(stop)
        and result.token_ids == free[: len(result.token_ids)]
    )


def test_bad_requests_are_refused_when_added(pair):
    loop = new_loop(pair)
    with pytest.raises(RequestError, match="max_draft_len=4"):
        loop.add("x", PROMPTS[0], SamplingParams(num_draft_tokens=5))
    with pytest.raises(RequestError, match="max_seq_len 128"):
        loop.add("x", PROMPTS[0], SamplingParams(max_new_tokens=125))
    with pytest.raises(RequestError, match="empty"):
        loop.add("x", [], SamplingParams())
    assert not loop.busy
