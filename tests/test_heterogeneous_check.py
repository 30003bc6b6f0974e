"""A draft with another tokenizer (issue 28) outside the engines: `check` on a tiny Llama-3.1-style target with a
Qwen2.5-style draft (conftest's cross_family_pair: byte-level BPEs of other sizes, the families' special tokens and
chat templates), the build plan, `deploy` for every runtime (where the draft's tokenizer reaches the entry models,
and the repository checks that guard it), and the entry models loading the pair from what deploy wrote."""

from __future__ import annotations

import json

import pytest
from harness.repo import fake_engine
from test_check import run_check, status_of, write_recipe
from transformers import AutoTokenizer

from trtspec.builders import plan as P
from trtspec.core.errors import CheckFailed, ModelError, RecipeError
from trtspec.core.tokenizers import HETEROGENEOUS_ALGORITHM
from trtspec.recipe import recipe_from_dict
from trtspec.triton_repo import interface as names
from trtspec.triton_repo.checks import check_repository
from trtspec.triton_repo.deploy import deploy
from trtspec.triton_repo.render import parse_model_config

OPT_IN = {"heterogeneous_vocab": True}


def _recipe(pair, **sections):
    data = {"name": "cross", "target": {"model": str(pair[0])}, "draft": {"model": str(pair[1])}}
    data["limits"] = {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128}
    for key, value in sections.items():
        data[key] = data.get(key, {}) | value
    return recipe_from_dict(data)


def _params(repo, model: str = names.ORCHESTRATOR) -> dict[str, str]:
    config = parse_model_config((repo / model / "config.pbtxt").read_text(), model)
    return {k: v.string_value for k, v in config.parameters.items()}


def _configs(repo) -> dict:
    return {
        m.name: parse_model_config((m / "config.pbtxt").read_text(), m.name)
        for m in repo.iterdir()
        if (m / "config.pbtxt").is_file()
    }


def _texts(tokenizer) -> set[str]:
    """Every token's text, byte fragments (no text of their own) left out: decoded id by id."""
    texts = (tokenizer.decode([i], skip_special_tokens=False) for i in range(len(tokenizer)))
    return {t for t in texts if t and "\ufffd" not in t}


# ------------------------------------------------------------------ check


def test_the_cross_family_pair_looks_like_its_families(cross_family_pair):
    target, draft = (AutoTokenizer.from_pretrained(p) for p in cross_family_pair)
    assert target.bos_token == "<|begin_of_text|>" and target.eos_token == "<|eot_id|>"
    assert target("x")["input_ids"][0] == target.bos_token_id  # Llama 3 prepends its bos
    assert draft.bos_token is None and (draft.eos_token, draft.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert len(target) != len(draft) and not set(target.all_special_tokens) & set(draft.all_special_tokens)
    chat = [{"role": "user", "content": "hi"}]
    assert "<|start_header_id|>" in target.apply_chat_template(chat, tokenize=False)
    assert "<|im_start|>" in draft.apply_chat_template(chat, tokenize=False)
    # More draft rows than target rows, as Qwen2.5's 151936 beside Llama 3's 128256.
    rows = [json.loads((p / "config.json").read_text())["vocab_size"] for p in cross_family_pair]
    assert rows[1] > rows[0]


def test_check_without_the_opt_in_fails_in_one_line_naming_heterogeneous_vocab(
    runner, tmp_path, cross_family_pair
):
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", *cross_family_pair))
    assert result.exit_code == 1
    failed = [c for c in payload["checks"] if c["status"] == "fail"]
    # One failure, the tokenizer's: the padded-vocab rule does not compare rows of two tokenizers.
    assert [c["name"] for c in failed] == ["tokenizer"]
    message = failed[0]["message"]
    assert "\n" not in message and message.startswith("vocabularies differ (target 300 tokens, draft 330)")
    assert "set speculative.heterogeneous_vocab: true" in message
    assert status_of(payload, "padded vocab")[0] == "pass"


def test_check_with_the_opt_in_passes_and_reports_overlap_algorithm_and_special_tokens(
    runner, tmp_path, cross_family_pair
):
    recipe = write_recipe(tmp_path / "r.yaml", *cross_family_pair, speculative=OPT_IN)
    result, payload = run_check(runner, recipe)
    assert result.exit_code == 0, result.output
    row = next(c for c in payload["checks"] if c["name"] == "tokenizer")
    assert row["status"] == "pass"
    target, draft = (AutoTokenizer.from_pretrained(p) for p in cross_family_pair)
    shared = len(_texts(target) & _texts(draft))  # counted here, apart from core/translate.py
    details = row["details"]
    assert (details["shared_tokens"], details["target_tokens"], details["draft_tokens"]) == (shared, 300, 330)
    assert 0 < shared < 300 and f"({shared / 300:.0%})" in row["message"]
    assert HETEROGENEOUS_ALGORITHM in row["message"] and details["algorithm"] == HETEROGENEOUS_ALGORITHM
    # Llama 3 and Qwen2.5 share no special token: each goes to the draft as text.
    assert details["specials"] == dict.fromkeys(target.all_special_tokens)
    assert "sent as text" in row["message"] and "<|begin_of_text|>" in row["message"]
    # The draft's 352 rows exceed the target's 300, which only a shared tokenizer would make a problem.
    status, message = status_of(payload, "padded vocab")
    assert status == "pass" and "its ids never reach the target" in message


@pytest.mark.parametrize(
    "sections, expected",
    [
        (
            {"triton": {"runtime": "trtllm-pytorch"}},
            "runtime trtllm-pytorch cannot serve a draft with another",
        ),
        (
            {"speculative": OPT_IN | {"use_draft_logits": True}},
            "use_draft_logits cannot be used with a draft",
        ),
        (
            {"speculative": OPT_IN | {"use_draft_logits": True}, "triton": {"runtime": "tensorrtllm"}},
            "its logits are over another vocabulary",
        ),
    ],
)
def test_check_refuses_what_cannot_serve_a_draft_with_its_own_tokenizer(
    runner, tmp_path, cross_family_pair, sections, expected
):
    sections = {"speculative": OPT_IN} | sections
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", *cross_family_pair, **sections))
    assert result.exit_code == 1
    status, message = status_of(payload, "tokenizer")
    assert status == "fail" and expected in message and "\n" not in message


def test_the_opt_in_on_a_pair_with_one_tokenizer_changes_nothing(runner, tmp_path, tiny_pair):
    plain, _ = run_check(runner, write_recipe(tmp_path / "a.yaml", *tiny_pair))
    result, payload = run_check(runner, write_recipe(tmp_path / "b.yaml", *tiny_pair, speculative=OPT_IN))
    assert result.exit_code == plain.exit_code == 0
    status, message = status_of(payload, "tokenizer")
    assert status == "pass" and "heterogeneous_vocab changes nothing" in message
    # Served alike: the same repository, draft-ahead on, no draft tokenizer to translate through.
    repos = {}
    for opt_in in (False, True):
        recipe = _recipe(tiny_pair, speculative={"heterogeneous_vocab": opt_in})
        out = tmp_path / f"repo-{opt_in}"
        deploy(recipe, "torch", out)
        repos[opt_in] = (out / names.ORCHESTRATOR / "config.pbtxt").read_text()
        assert _params(out)["draft_tokenizer_dir"] == ""
    assert repos[False] == repos[True]


# ------------------------------------------------------------------ build plan


def test_the_build_plan_takes_a_draft_with_more_vocab_rows_only_where_the_recipe_opts_in():
    def plan(**speculative):
        recipe = recipe_from_dict(
            {
                "name": "cross",
                "target": {"model": "/nowhere/target"},
                "draft": {"model": "/nowhere/draft"},
                "speculative": speculative,
            },
            check_paths=False,
        )
        facts = {
            role: (P.Path(f"/c/{role}"), P.checkpoint_facts(_ckpt(vocab)))
            for role, vocab in (("target", 300), ("draft", 352))
        }
        return P.make_build_plan(recipe, facts, {r: P.Path(f"/e/{r}") for r in P.ROLES})

    with pytest.raises(RecipeError, match="the draft has 352 vocab rows and the target 300"):
        plan()
    built = plan(heterogeneous_vocab=True)
    assert (
        built.draft.checkpoint.vocab_size == 352
        and built.draft.build_config["speculative_decoding_mode"] is None
    )
    assert built.target.build_config["speculative_decoding_mode"] == P.DRAFT_TOKENS_EXTERNAL


def _ckpt(vocab: int) -> dict:
    return {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "vocab_size": vocab,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    }


# ------------------------------------------------------------------ deploy


def test_torch_deploy_hands_the_entry_model_the_drafts_own_tokenizer(tmp_path, cross_family_pair):
    out = tmp_path / "repo"
    deploy(_recipe(cross_family_pair, speculative=OPT_IN), "torch", out)
    params = _params(out)
    assert params["draft_tokenizer_dir"] == params["draft_model_dir"] == str(cross_family_pair[1])
    assert params["tokenizer_dir"] == str(cross_family_pair[0]) and params["use_draft_logits"] == "False"
    check_repository(_configs(out))
    with pytest.raises(CheckFailed, match="pre-flight check tokenizer failed: vocabularies differ"):
        deploy(_recipe(cross_family_pair), "torch", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def _engines(root, pair):
    rows = [json.loads((p / "config.json").read_text())["vocab_size"] for p in pair]
    return {
        "target": fake_engine(root / "target", max_draft_len=4, vocab_size=rows[0]),
        "draft": fake_engine(root / "draft", max_draft_len=0, vocab_size=rows[1]),
    }


def test_tensorrtllm_deploy_hands_the_orchestrator_the_drafts_tokenizer_without_draft_ahead(
    tmp_path, cross_family_pair
):
    engines = _engines(tmp_path / "engines", cross_family_pair)
    recipe = _recipe(
        cross_family_pair, speculative=OPT_IN | {"max_draft_len": 4}, triton={"runtime": "tensorrtllm"}
    )
    assert recipe.triton.draft_ahead  # the recipe's default, which such a draft cannot use
    out = tmp_path / "repo"
    deploy(recipe, "tensorrtllm", out, engine_dirs=engines)
    params = _params(out)
    assert params["draft_tokenizer_dir"] == str(cross_family_pair[1]) and params["draft_ahead"] == "False"
    assert (params["target_vocab_rows"], params["draft_vocab_rows"]) == ("300", "352")
    # The draft engine model is built from the draft's own checkpoint: its rows, not the target's.
    assert _params(out, names.DRAFT_MODEL)["gpt_model_path"] == str(engines["draft"].resolve())
    configs = _configs(out)
    check_repository(configs)
    # Without the opt-in, the engines' rows are compared as for one tokenizer, and refused.
    no_opt_in = _recipe(
        cross_family_pair, speculative={"max_draft_len": 4}, triton={"runtime": "tensorrtllm"}
    )
    with pytest.raises(CheckFailed, match="the draft has 352 vocab rows and the target 300"):
        deploy(no_opt_in, "tensorrtllm", tmp_path / "refused", engine_dirs=engines)


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("draft_ahead", "True", "draft_ahead is True beside draft_tokenizer_dir"),
        ("use_draft_logits", "True", "use_draft_logits is True beside draft_tokenizer_dir"),
        ("tensorrt_llm_draft_model_name", "", "names no draft"),
    ],
)
def test_the_repository_check_refuses_a_draft_tokenizer_beside_what_cannot_use_it(
    tmp_path, cross_family_pair, key, value, expected
):
    recipe = _recipe(
        cross_family_pair, speculative=OPT_IN | {"max_draft_len": 4}, triton={"runtime": "tensorrtllm"}
    )
    out = tmp_path / "repo"
    deploy(recipe, "tensorrtllm", out, engine_dirs=_engines(tmp_path / "engines", cross_family_pair))
    configs = _configs(out)
    configs[names.ORCHESTRATOR].parameters[key].string_value = value
    with pytest.raises(CheckFailed, match=expected):
        check_repository(configs)


def test_the_torch_repository_check_refuses_a_draft_tokenizer_without_a_draft(tmp_path, cross_family_pair):
    out = tmp_path / "repo"
    deploy(_recipe(cross_family_pair, speculative=OPT_IN), "torch", out)
    configs = _configs(out)
    configs[names.ORCHESTRATOR].parameters["draft_model_dir"].string_value = ""
    with pytest.raises(CheckFailed, match="draft_model_dir names no draft"):
        check_repository(configs)


def test_trtllm_pytorch_deploy_refuses_a_draft_with_its_own_tokenizer(tmp_path, cross_family_pair):
    recipe = _recipe(cross_family_pair, speculative=OPT_IN, triton={"runtime": "trtllm-pytorch"})
    dirs = {"target": cross_family_pair[0], "draft": cross_family_pair[1]}
    with pytest.raises(
        CheckFailed, match="runtime trtllm-pytorch cannot serve a draft with another tokenizer"
    ):
        deploy(recipe, "trtllm-pytorch", tmp_path / "repo", model_dirs=dirs)
    assert not (tmp_path / "repo").exists()


# ------------------------------------------------------------------ the entry models load what deploy wrote


def test_the_torch_entry_model_loads_the_draft_with_its_own_tokenizer(tmp_path, cross_family_pair):
    from trtspec.triton_repo.models.inflight import load_loop
    from trtspec.triton_repo.models.text import TextCodec

    out = tmp_path / "repo"
    deploy(_recipe(cross_family_pair, speculative=OPT_IN), "torch", out)
    params = _params(out)
    thread = load_loop(params, TextCodec.from_parameters(params).tokenizer, 1, lambda: None, None)
    try:
        translator = thread.loop.rounds.translator
        assert translator is not None
        assert translator.draft_tok.name_or_path == str(cross_family_pair[1])
        assert translator.target_tok.name_or_path == str(cross_family_pair[0])
    finally:
        thread.stop()


def test_a_draft_tokenizer_folder_without_a_tokenizer_stops_the_entry_model_in_one_line(
    tmp_path, cross_family_pair
):
    from trtspec.core.errors import ServerError
    from trtspec.triton_repo.models.text import translator_from_parameters

    empty = tmp_path / "draft-without-tokenizer"
    empty.mkdir()
    target = AutoTokenizer.from_pretrained(cross_family_pair[0])
    params = {"tokenizer_dir": str(cross_family_pair[0]), "draft_tokenizer_dir": str(empty)}
    with pytest.raises(ServerError, match="no tokenizer there"):
        translator_from_parameters(params, target)
    assert translator_from_parameters(params | {"draft_tokenizer_dir": ""}, target) is None


def test_the_orchestrator_drafts_in_the_drafts_own_ids_and_keeps_the_target_greedy_output(
    monkeypatch, tmp_path, cross_family_pair
):
    """The rendered repository's orchestrator over the harness's stand-in engines (the PyTorch models behind
    TensorRT-LLM's tensors): the draft engine gets the draft's own ids and end id, and the output is the one a
    target-only request of the same repository gives."""
    import numpy as np
    from harness.engine_model import TorchEngine
    from test_lookup_engines import _request, served_orchestrator

    recipe = _recipe(
        cross_family_pair, speculative=OPT_IN | {"max_draft_len": 4}, triton={"runtime": "tensorrtllm"}
    )
    calls = []
    model = served_orchestrator(monkeypatch, recipe, tmp_path / "repo", calls)
    assert model.translator is not None and not model.draft_ahead
    draft_tok = model.translator.draft_tok
    assert draft_tok.eos_token_id != model.codec.eos_id  # the draft must be told its own end id
    sent = []
    run = TorchEngine.run

    def spy(self, inputs):  # what each engine model receives
        ids = np.asarray(inputs["input_ids"]).reshape(-1).tolist()
        sent.append((self.role, ids, int(np.asarray(inputs["end_id"]).reshape(-1)[0])))
        return run(self, inputs)

    monkeypatch.setattr(TorchEngine, "run", spy)
    prompt = "def add(a, b):\n    return"
    text, ids, stats = model._whole(_request(text_input=prompt, max_tokens=24)(model))
    to_draft = [(ids_, end) for role, ids_, end in sent if role == "draft"]
    sent.clear()
    alone, alone_ids, _ = model._whole(_request(text_input=prompt, max_tokens=24, num_draft_tokens=0)(model))
    assert {role for role, _, _ in sent} == {"target"}
    assert (text, ids) == (alone, alone_ids) and len(ids) > 0
    assert stats.drafted > 0 and to_draft
    # The draft reads the text so far in its own tokens (its tokenizer's encoding, no target bos), and stops at
    # its own end token.
    for draft_ids, end_id in to_draft:
        seen = draft_tok.decode(draft_ids, skip_special_tokens=False)
        assert seen.startswith(prompt) and draft_tok(seen)["input_ids"] == draft_ids
        assert end_id == draft_tok.eos_token_id
    assert to_draft[0][0] != model.codec.encode(prompt)[: len(to_draft[0][0])]


def test_in_process_validation_loads_the_pair_by_the_recipes_opt_in(cross_family_pair):
    from trtspec.validate.systems import EngineSystem

    system = EngineSystem.from_recipe(_recipe(cross_family_pair, speculative=OPT_IN), max_batch_size=1)
    assert system.engine.translator is not None
    with pytest.raises(ModelError, match="heterogeneous_vocab: true"):
        EngineSystem.from_recipe(_recipe(cross_family_pair), max_batch_size=1)
