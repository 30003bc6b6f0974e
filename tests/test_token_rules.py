"""core/token_rules.py: each rule on literal cases (Llama-3-Instruct's and Qwen2.5-Instruct's published ids), and
the same stop on every runtime that runs here: a pair shaped like each published one, its target steered to end
at the engines' end_id (the tokenizer's eos: Llama-3-Instruct's <|eot_id|>, Qwen2.5's <|im_end|>) or at another
stop id (a one-token stop word there), gives HF greedy's ids and text on the in-process engine, the TensorRT-LLM
runner (stand-in engines), and a real tritonserver with the torch runtime and with the tensorrtllm runtime's
orchestrator (stand-in engine models): the in-process APIs keep the stop id, the Triton client interface leaves it
out, the text is the same everywhere."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from tiny_models import make_family_pair, steer_to_eos

from trtspec.core.errors import ModelError
from trtspec.core.model_dir import end_ids, loaded_end_ids
from trtspec.core.token_rules import (
    KEEP_END,
    EngineStops,
    comparable_pair,
    engine_stops,
    generator_seed,
    model_end_ids,
    request_stop_ids,
    round_seeds,
)
from trtspec.engines.loop import new_generator
from trtspec.engines.sampling import SamplingParams
from trtspec.triton_repo.models.text import TextCodec

LLAMA3 = (128001, 128008, 128009)  # <|end_of_text|>, <|eom_id|>, <|eot_id|>; the tokenizer's eos: <|eot_id|>
QWEN25 = (151645, 151643)  # <|im_end|>, <|endoftext|>; the tokenizer's eos: <|im_end|>


def test_the_models_end_ids_are_the_generation_configs_else_the_tokenizers():
    assert model_end_ids(list(LLAMA3), 128009) == LLAMA3
    assert model_end_ids(151645, 151643) == (151645,)
    assert model_end_ids(None, 2) == (2,) and model_end_ids(None, None) == ()


def test_a_requests_stop_ids_are_its_own_else_the_models_and_none_with_ignore_eos():
    assert request_stop_ids(LLAMA3) == LLAMA3
    assert request_stop_ids(LLAMA3, own=(7,)) == (7,) and request_stop_ids(LLAMA3, own=()) == ()
    assert request_stop_ids(LLAMA3, ignore_eos=True, own=(7,)) == ()


@pytest.mark.parametrize(
    "stop_ids, tokenizer_eos, pad, expected",
    [
        (LLAMA3, 128009, None, EngineStops(128009, 128009, ((128001,), (128008,)))),
        (QWEN25, 151645, 151643, EngineStops(151645, 151643, ((151643,),))),
        ((7, 9), 2, None, EngineStops(7, 7, ((9,),))),  # the tokenizer's eos stops nothing: the first id
        ((), 2, None, EngineStops(-1, 0, ())),  # ignore_eos: an end_id no token matches
        ((5, 5), 5, 0, EngineStops(5, 0, ())),
    ],
)
def test_an_engine_call_gets_one_end_id_and_the_other_stop_ids_as_stop_words(
    stop_ids, tokenizer_eos, pad, expected
):
    assert engine_stops(stop_ids, tokenizer_eos, pad) == expected


def test_the_end_token_is_kept_in_process_dropped_through_triton_and_compared_cut():
    assert KEEP_END == {"in-process": True, "triton": False}
    reference = [5, 6, 128001]
    for candidate in ([5, 6, 128001], [5, 6]):  # either convention
        assert comparable_pair(reference, candidate, LLAMA3) == ([5, 6], [5, 6])
    assert comparable_pair([5, 6], [5, 6], LLAMA3) == ([5, 6], [5, 6])  # a length cut on both sides


def test_a_cut_at_the_stop_id_hides_neither_a_candidate_that_did_not_stop_nor_another_stop_id():
    # ran past its stop id: what it returned after it stays, so the pair differs there
    assert comparable_pair([5, 128009], [5, 128009, 7, 8], LLAMA3) == ([5], [5, 128009, 7, 8])
    # ended on 128001 where the reference chose 128009: a different greedy choice at the last token
    assert comparable_pair([5, 128009], [5, 128001], LLAMA3) == ([5, 128009], [5, 128001])


def test_round_seeds_are_none_when_greedy_and_one_draw_of_the_requests_generator_per_call_otherwise():
    assert round_seeds(True, torch.Generator()) == (None, None) and round_seeds(False, None, 3) == (None,) * 3
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    first = round_seeds(False, a, 3)
    assert first == round_seeds(False, b, 3) and len(set(first)) == 3 and round_seeds(False, a, 3) != first


def test_a_model_folders_end_ids_come_from_generation_config_then_config_then_the_tokenizer(
    tmp_path, shared_tokenizer_dir
):
    from transformers import AutoTokenizer

    folder = tmp_path / "model"
    shutil.copytree(shared_tokenizer_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert end_ids(folder, tokenizer) == (tokenizer.eos_token_id,)
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert end_ids(folder, tokenizer) == (9,)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert end_ids(folder, tokenizer) == (7, 8)
    # a generation_config.json without the field is what transformers loads (config.json's is not read then): the
    # files' rule and a loaded model's agree on the tokenizer's eos
    (folder / "generation_config.json").write_text(json.dumps({"max_length": 64}))
    assert end_ids(folder, tokenizer) == (tokenizer.eos_token_id,)


@pytest.mark.parametrize("eos", ["</s>", [2, None], 2.5, True, -1])
def test_an_eos_token_id_that_is_not_ids_is_a_one_line_error_naming_the_file(
    tmp_path, shared_tokenizer_dir, eos
):
    from transformers import AutoTokenizer

    folder = tmp_path / "model"
    shutil.copytree(shared_tokenizer_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    with pytest.raises(
        ModelError, match=r"generation_config.json: eos_token_id: must be a token id or a list"
    ):
        end_ids(folder, tokenizer)
    with pytest.raises(ModelError, match=r"eos_token_id: must be a token id"):
        loaded_end_ids(SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=eos)), tokenizer)


def test_a_generation_config_that_does_not_load_leaves_config_jsons_end_ids_as_transformers_does(
    tmp_path, shared_tokenizer_dir
):
    from tiny_models import make_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = make_model(tmp_path / "m", "llama", tokenizer_dir=shared_tokenizer_dir, num_hidden_layers=1)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"eos_token_id": [2, 5]}))
    (folder / "generation_config.json").write_text('{"eos_token_id": [2, 5')  # cut short
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert end_ids(folder, tokenizer) == loaded_end_ids(model, tokenizer) == (2, 5)


def test_a_loaded_model_without_an_eos_in_its_generation_config_agrees_with_its_folder(
    tmp_path, shared_tokenizer_dir
):
    from tiny_models import make_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = make_model(tmp_path / "m", "llama", tokenizer_dir=shared_tokenizer_dir, num_hidden_layers=1)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"eos_token_id": 9}))
    (folder / "generation_config.json").write_text(json.dumps({"max_length": 64}))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert loaded_end_ids(model, tokenizer) == end_ids(folder, tokenizer) == (tokenizer.eos_token_id,)


@pytest.mark.parametrize("family", ["llama3", "qwen2.5"])
def test_a_loaded_models_end_ids_are_its_folders(tmp_path, family):
    """The two readers of rule 1's inputs agree: files (the Triton entry models) and a loaded model's
    generation_config (the in-process engine, the validation reference), where each family keeps its eos list."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, _ = make_family_pair(tmp_path, family)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target)
    assert len(end_ids(target, tokenizer)) > 1  # the list, not the tokenizer's one eos
    assert loaded_end_ids(model, tokenizer) == end_ids(target, tokenizer)
    assert loaded_end_ids(object(), tokenizer) == (tokenizer.eos_token_id,) and loaded_end_ids(model, None)


def test_the_codec_reads_an_eos_list_from_generation_config(tmp_path, shared_tokenizer_dir):
    tokenizer_dir = tmp_path / "tok"
    shutil.copytree(shared_tokenizer_dir, tokenizer_dir)
    codec = TextCodec.from_parameters({"tokenizer_dir": str(tokenizer_dir)})
    eos = codec.tokenizer.eos_token_id
    assert codec.end_ids == (eos,) and codec.eos_id == eos
    (tokenizer_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, eos, 9]}))
    codec = TextCodec.from_parameters({"tokenizer_dir": str(tokenizer_dir)})
    assert codec.end_ids == (7, eos, 9) and engine_stops(codec.end_ids, codec.eos_id).end_id == eos
    (tokenizer_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    codec = TextCodec.from_parameters({"tokenizer_dir": str(tokenizer_dir)})
    assert engine_stops(codec.end_ids, codec.eos_id).end_id == 7


# ---------------------------------------------------------------- one stop, every runtime

PROMPT = "def add(a, b):"
MAX_NEW = 24
# family -> (the tokenizer's eos as the published instruct model has it: the engines' end_id, another of its end
# ids: a one-token stop word there)
INSTRUCT = {"llama3": ("<|eot_id|>", "</s>"), "qwen2.5": ("<|im_end|>", "<|endoftext|>")}
# Where the target is steered to stop: at the end_id itself, or at a stop word.
STOPS = ("end_id", "stop word")


@pytest.fixture(scope="module")
def instruct_pairs(tmp_path_factory):
    """(family, stop) -> (steered target, draft, prompt ids, HF greedy ids, HF greedy text, eos id, steered id)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache, pairs = {}, {}

    def build(family: str, stop: str):
        if (family, stop) in cache:
            return cache[family, stop]
        eos_token, stop_word = INSTRUCT[family]
        if family not in pairs:
            root = tmp_path_factory.mktemp(family.replace(".", ""))
            target, draft = make_family_pair(root / "pair", family)
            for folder in (target, draft):
                tokenizer = AutoTokenizer.from_pretrained(folder)
                tokenizer.eos_token = eos_token
                tokenizer.save_pretrained(folder)
            pairs[family] = root, target, draft
        root, target, draft = pairs[family]
        tokenizer = AutoTokenizer.from_pretrained(target)
        prompt = tokenizer.encode(PROMPT)
        steer_id = tokenizer.convert_tokens_to_ids(eos_token if stop == "end_id" else stop_word)
        steered = steer_to_eos(target, root / f"target-{STOPS.index(stop)}", steer_id, prompt)
        model = AutoModelForCausalLM.from_pretrained(steered).eval()
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False)
        reference = out[0, len(prompt) :].tolist()
        text = tokenizer.decode(reference, skip_special_tokens=True)
        cache[family, stop] = (steered, draft, prompt, reference, text, tokenizer.eos_token_id, steer_id)
        return cache[family, stop]

    return build


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("family", list(INSTRUCT))
def test_in_process_runtimes_stop_where_hf_greedy_stops_and_keep_the_stop_id(
    instruct_pairs, family, stop, tmp_path, fake_trtllm
):
    from test_trtllm_runner import write_engine

    from trtspec.engines.engine import SpeculativeEngine
    from trtspec.engines.sampling import SamplingParams
    from trtspec.engines.trtllm_runner import TrtllmSpeculativeRunner

    target, draft, prompt, reference, text, eos_id, steer_id = instruct_pairs(family, stop)
    assert reference[-1] == steer_id and len(reference) < MAX_NEW  # HF stops there
    assert (steer_id == eos_id) == (stop == "end_id")
    params = SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=3)
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4, max_seq_len=128)
    runner = TrtllmSpeculativeRunner.from_engine_dirs(
        write_engine(tmp_path / "target", target, max_draft_len=4),
        write_engine(tmp_path / "draft", draft),
        tokenizer_dir=target,
    )
    from tensorrt_llm.runtime import ModelRunnerCpp

    ModelRunnerCpp.calls.clear()
    for system in (engine, runner):
        (result,) = system.generate([prompt], params)
        assert result.token_ids == reference and result.text == text and result.finish_reason == "stop"
    # Every engine call ended at the tokenizer's eos and stopped at the other stop ids as one-token stop words.
    stop_words = [[t] for t in runner.eos_ids if t != eos_id]
    assert ModelRunnerCpp.calls and all(kw["end_id"] == eos_id for _, kw in ModelRunnerCpp.calls)
    assert all(
        kw["stop_words_list"] == [stop_words] * len(kw["stop_words_list"]) for _, kw in ModelRunnerCpp.calls
    )


def _served(repo, log, prompt_text: str, reference: list[int]):
    """(text, ids) of one greedy streamed request to a real tritonserver on ``repo``."""
    from triton_server import grpc_stream, running_server

    chunks: list[list[int]] = []
    with running_server(repo, log) as server:
        pieces, _ = grpc_stream(
            server, prompt_text, chunk_ids=chunks, max_tokens=MAX_NEW, stream=True, num_draft_tokens=3
        )
    return "".join(pieces), [t for chunk in chunks for t in chunk]


def _served_case(family: str, stop: str, runtime: str):
    # A stop word's id is dropped from the served text only here, by the same text rules on both runtimes, so
    # whether it is still a special token of the tokenizer shows on every stack through the torch runtime. The
    # end_id case is the engine's own stop (the real-model served tests, both stacks), and the tensorrtllm runtime
    # adds only the server's path (orchestrator, stand-in engine models), which no transformers release changes.
    one_stack = stop == "end_id" or runtime == "tensorrtllm"
    marks = [pytest.mark.one_stack] if one_stack else []
    return pytest.param(family, stop, runtime, marks=marks, id=f"{family}-{stop}-{runtime}")


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "stop", "runtime"),
    [_served_case(f, s, r) for f in INSTRUCT for s in STOPS for r in ("torch", "tensorrtllm")],
)
def test_triton_runtimes_stop_where_hf_greedy_stops_and_leave_the_stop_id_out(
    instruct_pairs, family, stop, runtime, tmp_path
):
    from harness.repo import deploy_harness
    from triton_server import tiny_recipe

    from trtspec.triton_repo.deploy import deploy

    target, draft, _, reference, text, _, steer_id = instruct_pairs(family, stop)
    recipe = tiny_recipe((target, draft))
    if runtime == "torch":
        deploy(recipe, "torch", tmp_path / runtime)
    else:
        deploy_harness(recipe, tmp_path / runtime)  # the orchestrator over the stand-in engine models
    assert reference[-1] == steer_id
    served_text, served_ids = _served(tmp_path / runtime, tmp_path / f"{runtime}.log", PROMPT, reference)
    assert (served_ids, served_text) == (reference[:-1], text)


def test_every_bit_of_a_64_bit_seed_gives_its_own_stream():
    # torch's CPU generator keeps the low 32 bits of a raw seed: s, s + 2**32 and s + 2**63 would share a stream
    seeds = [5, 5 + 2**32, 5 + 2**63, 2**64 - 1, 0]
    mixed = [generator_seed(s) for s in seeds]
    assert len({m & 0xFFFF_FFFF for m in mixed}) == len(seeds) and all(0 <= m < 2**64 for m in mixed)
    streams = {tuple(torch.rand(4, generator=torch.Generator().manual_seed(m)).tolist()) for m in mixed}
    assert len(streams) == len(seeds)
    # and the engine's request generators use it
    draws = {
        tuple(torch.rand(4, generator=new_generator(SamplingParams(temperature=1.0, seed=s), "cpu")).tolist())
        for s in (5, 5 + 2**32)
    }
    assert len(draws) == 2
