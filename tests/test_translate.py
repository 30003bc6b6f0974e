"""Drafts with another tokenizer (core/translate.py): the text round trip, the boundary alignment, and exact output on
the runtimes that run here: the PyTorch engine (greedy, and sampled with the target's distribution kept) and the
engine-call round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_engine import hf_greedy
from test_engine_sampling import BUGS, follows, plant, target_joint

from trtspec.core.errors import ModelError
from trtspec.core.translate import DraftView, Translator, vocab_overlap
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.engine_calls import EngineCallRounds
from trtspec.engines.rounds import Row
from trtspec.engines.sampling import SamplingParams

TEXT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, item):\n"


@pytest.fixture(scope="module")
def other_tokenizer_dir(tmp_path_factory):
    """A byte-level BPE of another size over the same corpus (its merges, so its token boundaries, differ)."""
    from tiny_models import make_tokenizer

    out = tmp_path_factory.mktemp("othertok")
    make_tokenizer(out, vocab_size=290)
    return out


@pytest.fixture(scope="module")
def tokenizers(shared_tokenizer_dir, other_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(shared_tokenizer_dir), AutoTokenizer.from_pretrained(
        other_tokenizer_dir
    )


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory, other_tokenizer_dir):
    from tiny_models import make_model

    return make_model(
        tmp_path_factory.mktemp("otherdraft"),
        "llama",
        tokenizer_dir=other_tokenizer_dir,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        seed=7,
    )


def test_the_draft_reads_the_targets_text_and_writes_target_tokens_at_a_boundary(tokenizers):
    target_tok, draft_tok = tokenizers
    assert target_tok.get_vocab() != draft_tok.get_vocab()
    translator = Translator(target_tok, draft_tok)
    head, tail = TEXT[:20], TEXT[20:]
    target_ids = target_tok(head)["input_ids"]  # with the tokenizer's <s>
    draft_ids = translator.to_draft(target_ids)
    assert draft_tok.decode(draft_ids, skip_special_tokens=True) == head
    assert draft_ids[: len(translator.draft_start)] == translator.draft_start
    proposal = translator.to_target(target_ids, draft_tok(tail, add_special_tokens=False)["input_ids"])
    assert proposal, "a continuation of plain text proposes target tokens"
    # The proposal writes the draft's text after the emitted tokens, as the target's own tokenizer would
    # (what the target would emit greedily if it agreed with the draft).
    assert target_tok.decode(target_ids + proposal, skip_special_tokens=True) == TEXT
    assert proposal == target_tok(TEXT)["input_ids"][len(target_ids) :]


def test_a_merge_across_the_boundary_keeps_the_emitted_tokens_and_proposes_the_rest_of_the_text(tokenizers):
    """The target stopped inside a word it writes as one token; the draft's continuation completes the word, so the
    target's encoding of the whole would rewrite the emitted piece. The proposal never does: it is the
    continuation's text encoded on its own, after the emitted tokens."""
    target_tok, draft_tok = tokenizers
    translator = Translator(target_tok, draft_tok)
    words = [target_tok.convert_tokens_to_string([t]) for t in target_tok.get_vocab()]
    word = max((w for w in words if w.startswith(" ") and w[1:].isalpha()), key=len)
    assert len(word) >= 4 and len(target_tok(word, add_special_tokens=False)["input_ids"]) == 1
    emitted = target_tok("x =" + word[:3])["input_ids"]
    assert target_tok.decode(emitted, skip_special_tokens=True) == "x =" + word[:3]
    continuation = draft_tok(word[3:] + " a", add_special_tokens=False)["input_ids"]
    proposal = translator.to_target(emitted, continuation)
    assert proposal == target_tok(word[3:] + " a", add_special_tokens=False)["input_ids"]
    assert target_tok.decode(emitted + proposal, skip_special_tokens=True) == "x =" + word + " a"


@pytest.mark.parametrize("tail", ["é", "你好", "é'"])
def test_a_proposal_ending_in_a_whole_multi_byte_character_keeps_it(tokenizers, tail):
    """Each byte token of a character the byte-level BPE has no token for decodes to U+FFFD alone: the proposal
    is judged as a whole, and only bytes of a character left unfinished are dropped."""
    target_tok, draft_tok = tokenizers
    translator = Translator(target_tok, draft_tok)
    emitted = target_tok("x = 'caf")["input_ids"]
    continuation = draft_tok(tail, add_special_tokens=False)["input_ids"]
    proposal = translator.to_target(emitted, continuation)
    assert target_tok.decode(proposal) == tail
    cut = translator.to_target(emitted, continuation[:-1])  # the last character's bytes cut short
    assert "\ufffd" not in target_tok.decode(cut) and tail.startswith(target_tok.decode(cut))


def test_vocab_overlap_counts_shared_texts_and_maps_specials_by_text(tokenizers):
    target_tok, draft_tok = tokenizers
    overlap = vocab_overlap(target_tok, draft_tok)
    assert 0.5 < overlap.share < 1.0 and overlap.target_size == len(target_tok.get_vocab())
    assert overlap.specials == {t: t for t in target_tok.all_special_tokens}
    assert f"({overlap.share:.0%})" in overlap.describe()


def test_a_draft_with_another_tokenizer_needs_the_opt_in(tiny_pair, other_draft):
    with pytest.raises(ModelError, match="heterogeneous_vocab: true"):
        SpeculativeEngine.from_pretrained(tiny_pair[0], other_draft, max_draft_len=4, max_seq_len=128)


PROMPTS = ["def add(a, b):\n", "class Stack:\n    def push(self, item):\n"]


def test_greedy_output_with_a_draft_of_another_tokenizer_is_the_targets(tiny_pair, other_draft, tokenizers):
    target, _ = tiny_pair
    target_tok, _ = tokenizers
    engine = SpeculativeEngine.from_pretrained(
        target, other_draft, max_draft_len=4, max_seq_len=128, heterogeneous_vocab=True
    )
    assert engine.translator is not None
    prompts = [target_tok(p)["input_ids"] for p in PROMPTS]
    results = engine.generate(prompts, SamplingParams(max_new_tokens=24, num_draft_tokens=4))
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == hf_greedy(target, prompt, 24)
    assert sum(r.stats.drafted for r in results) > 0  # translated proposals reached the target


def test_a_row_whose_text_outgrows_the_drafts_cache_drafts_nothing_and_fails_no_row(
    tiny_pair, other_draft, tokenizers
):
    """The limits bound a row in target tokens; the draft's tokenizer takes more for the same text (TEXT: 47
    target tokens, 53 of the draft's). With max_seq_len 52 that row's text no longer fits the draft's cache: it
    drafts nothing, so it cannot fail the batch (a failed round fails every row in it); the other row drafts."""
    target, _ = tiny_pair
    target_tok, draft_tok = tokenizers
    long, short = target_tok(TEXT)["input_ids"], target_tok("def f")["input_ids"]
    assert len(long) + 5 <= 52 < len(draft_tok(TEXT)["input_ids"])
    engine = SpeculativeEngine.from_pretrained(
        target, other_draft, max_draft_len=4, max_seq_len=52, heterogeneous_vocab=True
    )
    results = engine.generate([long, short], SamplingParams(max_new_tokens=5, num_draft_tokens=4))
    for prompt, result in zip([long, short], results, strict=True):
        assert result.token_ids == hf_greedy(target, prompt, 5)
    assert results[0].stats.drafted == 0 and results[1].stats.drafted > 0


def test_a_translated_proposal_is_cut_to_the_rounds_k_so_a_row_at_the_context_limit_finishes(
    cross_family_pair, monkeypatch
):
    """One draft token's text may take several target tokens: the proposal is cut to the K the loop gave the row
    (within its budget), so a row whose prompt and budget fill max_seq_len never verifies past its cache."""
    from trtspec.engines import speculative

    target, draft = cross_family_pair
    tokenizer = SpeculativeEngine.from_pretrained(target, None).tokenizer
    prompt = tokenizer("import os\nimport sys\n\n")["input_ids"]
    engine = SpeculativeEngine.from_pretrained(
        target,
        draft,
        heterogeneous_vocab=True,
        max_batch_size=1,
        max_seq_len=len(prompt) + 3,
        max_draft_len=8,
    )
    verified, real = [], speculative.verify

    def spy(target_model, rows, draft_tokens, num_draft, *rest):
        verified.append((list(num_draft), [r.max_len - len(r.tokens) for r in rows]))
        return real(target_model, rows, draft_tokens, num_draft, *rest)

    monkeypatch.setattr(speculative, "verify", spy)
    params = SamplingParams(max_new_tokens=3, num_draft_tokens=2, ignore_eos=True)
    result = engine.generate([prompt], params)[0]
    target_only = SpeculativeEngine.from_pretrained(
        target, None, max_batch_size=1, max_seq_len=len(prompt) + 3
    )
    assert (
        result.token_ids
        == target_only.generate([prompt], SamplingParams(max_new_tokens=3, ignore_eos=True))[0].token_ids
    )
    assert verified and all(
        n <= min(2, left - 1) for ks, lefts in verified for n, left in zip(ks, lefts, strict=True)
    )


def test_near_the_end_of_the_drafts_cache_a_row_drafts_what_still_fits(tiny_pair, other_draft, tokenizers):
    """With max_seq_len 55 the same row starts two draft tokens short of the draft's cache: it drafts fewer than
    K while they fit (capped per row, not dropped), then nothing, and its output stays the target's."""
    from trtspec.core.sequences import draft_room

    target, _ = tiny_pair
    target_tok, draft_tok = tokenizers
    long = target_tok(TEXT)["input_ids"]
    assert draft_room(len(draft_tok(TEXT)["input_ids"]), 55) == 2
    engine = SpeculativeEngine.from_pretrained(
        target, other_draft, max_draft_len=4, max_seq_len=55, heterogeneous_vocab=True
    )
    (result,) = engine.generate([long], SamplingParams(max_new_tokens=8, num_draft_tokens=4))
    assert result.token_ids == hf_greedy(target, long, 8)
    drafted_k = [k for k, rounds in enumerate(result.stats.num_draft_histogram) if rounds and k]
    assert drafted_k and max(drafted_k) <= 2  # some rounds drafted, none more than the room left


def test_an_engine_call_round_sends_no_row_the_draft_engine_could_not_take(tokenizers):
    """The same on the TensorRT-LLM engines: a row whose draft tokens and the call's K pass the engines'
    max_seq_len is left out of the draft call and verified without a draft."""
    target_tok, draft_tok = tokenizers
    translator = Translator(target_tok, draft_tok)
    tail = draft_tok(" + b\n", add_special_tokens=False)["input_ids"]
    calls = DraftSpaceCalls(tail)
    rounds = EngineCallRounds(calls, max_draft_len=8, num_slots=2, max_seq_len=52, translator=translator)
    long = Row(target_tok(TEXT)["input_ids"], 0, max_len=52)
    short = Row(target_tok("return a")["input_ids"], 1, max_len=52)
    before = list(short.tokens)
    outcomes = rounds.run([long, short], [len(tail)] * 2, SamplingParams(max_new_tokens=4), None)
    assert calls.prefixes == [translator.to_draft(before)]  # the long row was not sent
    assert outcomes[0].num_draft == 0 and outcomes[1].num_accepted == len(translator.to_target(before, tail))


def test_a_row_moved_to_a_freed_slot_keeps_its_drafts_tokens(tiny_pair, other_draft, tokenizers, monkeypatch):
    """Rows that finish apart: the loop moves the row on the highest slot into the hole (rounds.Rounds.move), and
    the draft's own tokens and cache go with it: every row is the target's greedy continuation, and accepts what
    it accepts without the moves."""
    from trtspec.engines.loop import GenerationLoop
    from trtspec.engines.speculative import TorchRounds

    moves = []
    move = TorchRounds.move
    monkeypatch.setattr(
        TorchRounds, "move", lambda self, row, slot: moves.append(slot) or move(self, row, slot)
    )
    target, _ = tiny_pair
    engine = SpeculativeEngine.from_pretrained(
        target, other_draft, max_draft_len=4, max_seq_len=128, heterogeneous_vocab=True
    )
    prompts = [tokenizers[0](p)["input_ids"] for p in [*PROMPTS, "import os\n"]]
    budgets = [3, 24, 12]
    params = SamplingParams(max_new_tokens=24, num_draft_tokens=3, ignore_eos=True)
    fed = []  # tokens the draft computed: a row whose draft state stayed behind would be fed its text again
    forward = engine.draft.forward
    monkeypatch.setattr(engine.draft, "forward", lambda *a: fed.append(sum(a[3])) or forward(*a))

    def results():
        fed.clear()
        return list(engine.generate_stream(prompts, params, max_new_tokens=budgets))[-1].results, sum(fed)

    compacted, compacted_fed = results()
    assert moves and all(slot == 0 for slot in moves)
    monkeypatch.setattr(GenerationLoop, "_compact", lambda self: None)
    in_place, in_place_fed = results()
    for prompt, budget, result, alone in zip(prompts, budgets, compacted, in_place, strict=True):
        assert result.token_ids == hf_greedy(target, prompt, budget)
        assert (result.stats.drafted, result.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)
    assert sum(r.stats.drafted for r in compacted) > 0 and compacted_fed == in_place_fed


def test_opting_in_on_a_pair_sharing_one_tokenizer_changes_nothing(tiny_pair):
    engine = SpeculativeEngine.from_pretrained(
        *tiny_pair, max_draft_len=4, max_seq_len=128, heterogeneous_vocab=True
    )
    assert engine.translator is None


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_sampled_output_with_a_draft_of_another_tokenizer_follows_the_target(
    monkeypatch, tmp_path_factory, small_vocab_pair, bug
):
    """The draft samples in its own vocabulary; its text reaches the target as point masses, so the 2-token joint
    is the target's; the planted bugs are detected."""
    plant(monkeypatch, bug)
    target, _ = small_vocab_pair
    draft = permuted_draft(target, tmp_path_factory.mktemp("sampled-other"))
    engine = SpeculativeEngine.from_pretrained(
        target, draft, max_draft_len=2, max_batch_size=256, max_seq_len=16, heterogeneous_vocab=True
    )
    prompt = [1, 2, 3]
    counts, drafted = torch.zeros(64, dtype=torch.long), 0
    for seed in range(12):
        params = SamplingParams(
            max_new_tokens=2, temperature=0.5, seed=seed, ignore_eos=True, num_draft_tokens=2
        )
        for result in engine.generate([prompt] * 256, params):
            counts[result.token_ids[0] * 8 + result.token_ids[1]] += 1
            drafted += result.stats.drafted
    assert drafted > 0
    assert follows(counts, target_joint(target, prompt, SamplingParams(temperature=0.5))) == (bug is None)


def permuted_draft(target: Path, out: Path) -> Path:
    """The target under another tokenizer: its tokenizer with ids 4-7 (byte tokens) in reverse order, its
    embedding and output rows permuted to match, and its logits three times sharper. Its distribution over texts
    is near the target's but not it (a draft equal to the target would hide a rule that accepts everything; a
    near-uniform one, a rule that samples rejections from the target); its ids are not the target's."""
    import shutil

    from transformers import AutoModelForCausalLM

    order = [0, 1, 2, 3, 7, 6, 5, 4]  # draft id -> target id
    model = AutoModelForCausalLM.from_pretrained(target)
    with torch.no_grad():
        for weights in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            weights.copy_(weights[order])
        model.get_output_embeddings().weight.mul_(3.0)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (target / name).exists():
            shutil.copy(target / name, out / name)
    spec = json.loads((out / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    for draft_id, target_id in enumerate(order):
        vocab[by_id[target_id]] = draft_id
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out


class DraftSpaceCalls:
    """An EngineCalls whose draft engine works in the draft's tokens (it continues with ``continuation``) and whose
    target accepts whatever it is given, then adds one token."""

    draft_vocab, target_logit_rows = 0, 0

    def __init__(self, continuation: list[int]):
        self.continuation, self.prefixes, self.verified = continuation, [], []

    def propose(self, prefixes, num_tokens, call, want_logits):
        from trtspec.engines.engine_calls import Draft

        self.prefixes += prefixes
        return [Draft(self.continuation[:num_tokens]) for _ in prefixes]

    def verify(self, prefixes, drafts, draft_logits, max_new_tokens, call):
        self.verified.append(drafts)
        return [d + [7] for d in drafts] if drafts else [[7] for _ in prefixes]


def test_the_engine_call_round_sends_the_draft_its_own_tokens_and_the_target_translated_ones(tokenizers):
    target_tok, draft_tok = tokenizers
    translator = Translator(target_tok, draft_tok)
    tail = draft_tok(" + b\n", add_special_tokens=False)["input_ids"]
    calls = DraftSpaceCalls(tail)
    rounds = EngineCallRounds(calls, max_draft_len=8, num_slots=1, max_seq_len=64, translator=translator)
    row = Row(target_tok("return a")["input_ids"], 0, max_len=64)
    before = list(row.tokens)
    (outcome,) = rounds.run([row], [len(tail)], SamplingParams(max_new_tokens=16), None)
    assert calls.prefixes == [translator.to_draft(before)]
    (sent,) = calls.verified[0]
    assert sent == translator.to_target(before, tail) and sent
    assert target_tok.decode(before + sent, skip_special_tokens=True) == "return a + b\n"
    assert outcome.tokens == sent + [7] and outcome.num_accepted == len(sent)


def test_the_engine_call_round_cuts_a_translated_proposal_to_the_rows_k(tokenizers):
    """One call drafts the largest K of the batch, and one draft token's text may take several target tokens (here
    the larger vocabulary drafts for the smaller): each row verifies at most its own K (a pinned K is kept, and the
    loop's budget guard holds), as the torch round does."""
    draft_tok, target_tok = tokenizers
    translator = Translator(target_tok, draft_tok)
    tail = draft_tok(" import os\n", add_special_tokens=False)["input_ids"]
    calls = DraftSpaceCalls(tail)
    rounds = EngineCallRounds(calls, max_draft_len=8, num_slots=2, max_seq_len=64, translator=translator)
    rows = [Row(target_tok("return a")["input_ids"], slot, max_len=64) for slot in (0, 1)]
    assert len(translator.to_target(list(rows[1].tokens), tail[:2])) > 2
    outcomes = rounds.run(rows, [len(tail), 2], SamplingParams(max_new_tokens=16), None)
    assert len(calls.verified[0][1]) == 2 and outcomes[1].num_draft == 2


@pytest.fixture(scope="module")
def sentencepiece(tokenizers):
    """(byte-level BPE, a Llama-2-style SentencePiece tokenizer): the decoder of the second drops the space a text
    starts with, and its normalizer puts a word start before every text it encodes."""
    from tiny_models import make_sentencepiece_tokenizer

    return tokenizers[0], make_sentencepiece_tokenizer()


def test_a_tokenizer_is_told_sentencepiece_by_how_it_encodes_and_decodes_a_word(sentencepiece):
    from trtspec.core.translate import _Codec

    byte_level, sp = sentencepiece
    assert (_Codec(sp).marks_words, _Codec(sp).drops_space) == (True, True)
    assert (_Codec(byte_level).marks_words, _Codec(byte_level).drops_space) == (False, False)


def test_a_sentencepiece_drafts_continuation_keeps_the_space_it_starts_with(sentencepiece):
    """``▁brown ▁fox`` decoded alone is "brown fox": read after the text it continues, it is " brown fox"."""
    byte_level, sp = sentencepiece
    translator = Translator(byte_level, sp)
    head = byte_level("The quick")["input_ids"]
    full = sp("The quick brown fox", add_special_tokens=False)["input_ids"]
    continuation = full[len(sp("The quick", add_special_tokens=False)["input_ids"]) :]
    assert sp.decode(continuation) == "brown fox"  # what the translation read before
    proposal = translator.to_target(head, continuation)
    assert byte_level.decode(head + proposal, skip_special_tokens=True) == "The quick brown fox"


def test_a_sentencepiece_target_gets_no_proposal_that_would_start_a_word_inside_one(sentencepiece):
    """The target stopped inside a word ("br"); its tokenizer encodes a text on its own as a word start, so "own
    fox" alone is "▁o w n ▁fox", " own fox" after "br". Where no window re-encodes to the emitted tokens, nothing
    is proposed rather than text the draft did not write."""
    byte_level, sp = sentencepiece
    translator = Translator(sp, byte_level)
    emitted = sp("The quick br")["input_ids"]
    proposal = translator.to_target(emitted, byte_level("own fox", add_special_tokens=False)["input_ids"])
    text = sp.decode(emitted + proposal, skip_special_tokens=True)
    assert "The quick brown fox".startswith(text)
    # after a whole word the continuation re-encodes with the window, and its text is the draft's
    emitted = sp("The quick")["input_ids"]
    proposal = translator.to_target(emitted, byte_level(" brown fox", add_special_tokens=False)["input_ids"])
    assert proposal and sp.decode(emitted + proposal, skip_special_tokens=True) == "The quick brown fox"


@pytest.mark.parametrize(
    "before, after",
    [
        ("zzqx The quick brown fox jumps over", " the lazy dog"),
        ("The quick brown fox jumps over the lazy dog quickly", " and more"),
        ("def add(a, b):\n    return a + b\n\nclass Point:", " def push(self, item)"),
        ("def add(a, b):\n    return a + b\n", "\nclass Point:\n    pass"),
        ('s = "héllo wörld"\n', "print(s) # – done"),
    ],
)
def test_a_sentencepiece_drafts_view_re_encodes_its_tail_from_a_word_start(sentencepiece, before, after):
    """to_draft re-encodes only the view's tail: from a word start (``▁``), since re-encoded from inside a word the
    tail would gain a word start ("zzqx" read "zz qx") and the draft would read text the row does not hold."""
    byte_level, sp = sentencepiece
    translator = Translator(byte_level, sp)
    view = DraftView()
    translator.to_draft(byte_level(before)["input_ids"], view)
    ids = translator.to_draft(byte_level(before + after)["input_ids"], view)
    assert sp.decode(ids, skip_special_tokens=True) == before + after
    assert ids == translator.to_draft(byte_level(before + after)["input_ids"])


def test_align_says_why_it_cannot_distil_a_draft_with_another_tokenizer(tiny_pair, other_draft, tmp_path):
    import yaml
    from click.testing import CliRunner

    from trtspec.cli import cli

    recipe = {
        "name": "other",
        "target": {"model": str(tiny_pair[0])},
        "draft": {"model": str(other_draft)},
        "speculative": {"max_draft_len": 4, "heterogeneous_vocab": True},
        "limits": {"max_input_len": 64, "max_seq_len": 128},
    }
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(recipe))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    args = ["align", str(path), "--prompts", str(prompts), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert (
        "align distils the draft on the target's token distributions, which needs one tokenizer"
        in result.output
    )
    assert not (tmp_path / "out").exists()


def test_the_trtllm_runner_drafts_in_the_drafts_own_ids_and_returns_the_targets_greedy_output(
    fake_trtllm, cross_family_pair, tmp_path
):
    """The in-process TensorRT-LLM runner (stand-in engines: the PyTorch models behind ModelRunnerCpp's calls) over
    a Llama-3-style target and a Qwen2.5-style draft: the draft engine is called in its own ids and the output is
    HF greedy's."""
    from test_trtllm_runner import hf_greedy, write_engine
    from transformers import AutoTokenizer

    from trtspec.core import layout
    from trtspec.engines.trtllm_runner import TrtllmSpeculativeRunner
    from trtspec.recipe import recipe_from_dict

    target, draft = cross_family_pair
    recipe = recipe_from_dict(
        {
            "name": "cross",
            "target": {"model": str(target)},
            "draft": {"model": str(draft)},
            "speculative": {"max_draft_len": 4, "heterogeneous_vocab": True},
            "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        }
    )
    engines = tmp_path / "engines"
    root = layout.pair_dir("cross", engines)
    write_engine(layout.stage_dir(root, "target", layout.ENGINE), target, max_draft_len=4)
    draft_engine = write_engine(layout.stage_dir(root, "draft", layout.ENGINE), draft)
    runner = TrtllmSpeculativeRunner.from_recipe(recipe, engines_dir=engines)
    assert runner.translator is not None
    target_tok, draft_tok = AutoTokenizer.from_pretrained(target), AutoTokenizer.from_pretrained(draft)
    prompt = target_tok("def add(a, b):\n    return")["input_ids"]
    from tensorrt_llm.runtime import ModelRunnerCpp

    ModelRunnerCpp.calls.clear()
    (result,) = runner.generate([prompt], SamplingParams(max_new_tokens=16, num_draft_tokens=3))
    assert result.token_ids == hf_greedy(target, tuple(prompt), 16)
    to_draft = [kw for d, kw in ModelRunnerCpp.calls if d == str(draft_engine)]
    assert to_draft and result.stats.drafted > 0
    for kw in to_draft:  # the text so far, as the draft's tokenizer writes it
        (ids,) = kw["prompts"]
        assert draft_tok(draft_tok.decode(ids, skip_special_tokens=False))["input_ids"] == ids
        assert kw["end_id"] == draft_tok.eos_token_id
    # each draft call reads the text the target's next call holds: a view that lagged a round, or kept the prompt
    # only, would still leave the output the target's
    calls = ModelRunnerCpp.calls
    pairs = [
        (kw["prompts"][0], next(k["prompts"][0] for d2, k in calls[i + 1 :] if d2 != str(draft_engine)))
        for i, (d, kw) in enumerate(calls)
        if d == str(draft_engine) and any(d2 != str(draft_engine) for d2, _ in calls[i + 1 :])
    ]
    assert len(pairs) >= 2
    for draft_ids, target_ids in pairs:
        assert draft_tok.decode(draft_ids, skip_special_tokens=True) == target_tok.decode(
            target_ids, skip_special_tokens=True
        )


def test_the_drafts_view_re_encodes_only_its_tail_and_matches_a_whole_re_encoding(tokenizers):
    """Token by token along a text (as rounds append them), the incremental view gives the draft the tokens a
    whole re-encoding gives: it restarts at a word's first token, where byte-level BPE never merges across."""
    from trtspec.core.translate import DraftView

    target_tok, draft_tok = tokenizers
    translator = Translator(target_tok, draft_tok)
    ids = target_tok(TEXT * 2)["input_ids"]
    view = DraftView()
    for end in range(2, len(ids) + 1):
        assert translator.to_draft(ids[:end], view) == translator.to_draft(ids[:end]), end
    assert view.text == TEXT * 2
    # a view from another text (a guess that was not confirmed) starts over
    assert translator.to_draft(ids[:5], view) == translator.to_draft(ids[:5])
