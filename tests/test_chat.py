"""Chat prompts: rendered with the target tokenizer's own chat template, one BOS, reported per set.

A tiny pair whose tokenizer adds BOS itself (as Llama tokenizers do) and whose template writes ``{{ bos_token }}``
too: encoding the rendered text with the tokenizer's defaults would give two BOS, which is what these tests catch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_engine import hf_greedy
from test_validate import write_recipe
from tiny_models import make_model, make_tokenizer

from trtspec.chat import check_text_input, encode_prompt, user_message
from trtspec.cli import cli
from trtspec.core.errors import PromptSetError, RequestError
from trtspec.validate.prompts import CHAT_PROMPTS, Prompt, load_prompts

# ChatML-like, with the tokenizer's own special tokens: BOS at the start, </s> closing every turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CHAT_LINE = {
    "id": "c1",
    "messages": [{"role": "system", "content": "Be short."}, {"role": "user", "content": "add"}],
}


def make_chat_tokenizer(out_dir: Path, template: str | None = CHAT_TEMPLATE):
    """make_tokenizer's BPE, prepending <s> like a Llama tokenizer, with ``template`` as its chat template."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    tokenizer = make_tokenizer(out_dir)
    bos = tokenizer.bos_token_id
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer.chat_template = template
    tokenizer.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def template_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=True, add_generation_prompt=True, return_dict=False
    )


@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory):
    """(recipe, target_dir, tokenizer): a 2x64 target and 1x32 draft sharing the chat tokenizer."""
    root = tmp_path_factory.mktemp("chat")
    tokenizer = make_chat_tokenizer(root / "tokenizer")
    target = make_model(root / "target", tokenizer_dir=root / "tokenizer", seed=1)
    draft = make_model(root / "draft", tokenizer_dir=root / "tokenizer", hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=64, seed=2)  # fmt: skip
    return write_recipe(root / "chat.yaml", target, draft), target, tokenizer


def test_rendering_is_the_templates_ids_with_one_bos(chat_pair):
    from trtspec.triton_repo.models.text import TextCodec

    _, _, tokenizer = chat_pair
    messages = CHAT_LINE["messages"]
    text_input, ids = encode_prompt(tokenizer, "ignored", messages)
    assert ids == template_ids(tokenizer, messages)
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer(rendered).input_ids[:2] == [tokenizer.bos_token_id] * 2  # the mistake this avoids
    # What a server's entry model (special tokens added) makes of text_input: the same ids.
    assert not text_input.startswith("<s>") and TextCodec(tokenizer, end_ids=()).encode(text_input) == ids
    check_text_input(tokenizer, text_input, ids, "c1")
    assert encode_prompt(tokenizer, "def f():") == ("def f():", tokenizer("def f():").input_ids)


def test_the_demo_pair_renders_the_shipped_chat_set_like_apply_chat_template():
    from trtspec.core.model_dir import load_tokenizer
    from trtspec.recipe import DEMO_DIR
    from trtspec.triton_repo.models.text import TextCodec

    tokenizer = load_tokenizer(DEMO_DIR / "target")
    assert load_tokenizer(DEMO_DIR / "draft").chat_template == tokenizer.chat_template
    chats = [p for p in load_prompts() if p.prompt_set == "chat"]
    assert chats and [p.id for p in chats] == [p.id for p in load_prompts(CHAT_PROMPTS)]
    for prompt in chats:
        text_input, ids = encode_prompt(tokenizer, prompt.text, prompt.messages)
        assert ids == template_ids(tokenizer, prompt.messages) and ids.count(tokenizer.bos_token_id) == 1
        assert TextCodec(tokenizer, end_ids=()).encode(text_input) == ids


def test_a_template_without_the_bos_its_tokenizer_adds_cannot_go_as_text_input(tmp_path):
    tokenizer = make_chat_tokenizer(tmp_path, CHAT_TEMPLATE.removeprefix("{{ bos_token }}"))
    text_input, ids = encode_prompt(tokenizer, "", user_message("add"))
    assert ids == template_ids(tokenizer, user_message("add")) and tokenizer.bos_token_id not in ids
    with pytest.raises(RequestError, match="c9: the chat template's rendering does not survive"):
        check_text_input(tokenizer, text_input, ids, "c9")


def test_prompt_files_take_messages_and_chat_makes_raw_prompts_chats(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "def f():"}) + "\n" + json.dumps(CHAT_LINE) + "\n")
    raw, chat = load_prompts(path)
    assert (raw.prompt_set, raw.messages) == ("raw", None)
    assert chat == Prompt("c1", "add", "prompt", tuple(CHAT_LINE["messages"])) and chat.prompt_set == "chat"
    as_chats = load_prompts(path, chat=True)
    assert as_chats[0].messages == ({"role": "user", "content": "def f():"},) and as_chats[1] == chat
    bad = {
        '{"messages": []}': '"messages" must be a non-empty list',
        '{"messages": [{"role": "user"}]}': '"messages" must be a non-empty list',
        '{"messages": "hi"}': '"messages" must be a non-empty list',
        '{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}': 'give "messages" .* not both',
        # half a UTF-16 pair (text cut inside an emoji) would reach the tokenizer as a TypeError
        r'{"prompt": "def f\ud83d(x):"}': r"holds half of a UTF-16 pair \(\\ud83d\), as text cut inside",
        r'{"messages": [{"role": "user", "content": "\udc00"}]}': r"holds half of a UTF-16 pair \(\\udc00\)",
    }
    for line, message in bad.items():
        path.write_text(line + "\n")
        with pytest.raises(PromptSetError, match="p.jsonl:1: " + message):
            load_prompts(path)
    path.write_text(r'{"prompt": "a whole pair \ud83d\ude00"}' + "\n")
    assert load_prompts(path)[0].text == "a whole pair \U0001f600"


def test_generate_chat_prompts_the_model_with_the_rendered_ids(runner, chat_pair):
    _, target, tokenizer = chat_pair
    args = [
        "generate",
        "--recipe",
        str(chat_pair[0]),
        "--prompt",
        "def add",
        "--max-new-tokens",
        "6",
        "--json",
    ]
    result = runner.invoke(cli, [*args, "--chat", "--num-draft-tokens", "2"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    expected = template_ids(tokenizer, user_message("def add"))
    assert payload["prompt_token_ids"] == expected
    assert payload["token_ids"] == hf_greedy(target, expected, 6)
    raw = json.loads(runner.invoke(cli, args).stdout)
    assert raw["prompt_token_ids"] == tokenizer("def add").input_ids


def _no_model_loads(monkeypatch):
    from trtspec.core import model_dir
    from trtspec.engines import engine, models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(engine.SpeculativeEngine, "from_pretrained", refuse)
    monkeypatch.setattr(models, "load_hf_model", refuse)  # the engines' loader
    monkeypatch.setattr(model_dir, "load_hf_model", refuse)  # the reference's


def test_chat_without_a_template_is_one_line_before_any_model_loads(runner, tiny_pair, tmp_path, monkeypatch):
    _no_model_loads(monkeypatch)
    target, draft = tiny_pair
    recipe = write_recipe(tmp_path / "tiny.yaml", target, draft)
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(CHAT_LINE) + "\n")
    report, out_dir = tmp_path / "report.md", tmp_path / "bench"
    commands = [
        ["generate", "--target", str(target), "--draft", str(draft), "--chat", "--prompt", "x"],
        ["validate", str(recipe), "--prompts", str(chats), "--report", str(report)],
        ["bench", str(recipe), "--chat", "--out", str(out_dir)],
    ]
    for args in commands:
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert f"{target}: the tokenizer has no chat template" in result.output
    assert not report.exists() and not out_dir.exists()


def test_the_shipped_chat_set_is_left_out_for_a_target_without_a_template(tiny_pair, tmp_path, chat_pair):
    from trtspec.recipe import load_recipe
    from trtspec.validate.inputs import load_requests

    def default_set(target, draft):
        recipe = write_recipe(
            tmp_path / "r.yaml", target, draft
        )  # limits wide enough for the tiny BPE's tokens
        recipe.write_text(recipe.read_text().replace("max_input_len: 128", "max_input_len: 200"))
        return load_requests(load_recipe(recipe), None, None, False, 4)

    prompts, _, _, notes = default_set(*tiny_pair)
    assert {p.prompt_set for p in prompts} == {"raw"} and "no chat template" in notes[0]
    _, _, requests, notes = default_set(chat_pair[1], chat_pair[1])
    assert [r.prompt_set for r in requests].count("chat") == len(load_prompts(CHAT_PROMPTS)) and not notes


def test_validate_reports_the_chat_set_apart(runner, chat_pair, tmp_path):
    recipe, target, tokenizer = chat_pair
    prompts = tmp_path / "mixed.jsonl"
    prompts.write_text(
        json.dumps({"id": "r1", "prompt": "def add(a, b):"}) + "\n" + json.dumps(CHAT_LINE) + "\n"
    )
    report = tmp_path / "report.md"
    args = ["validate", str(recipe), "--prompts", str(prompts), "--max-tokens", "6", "--report", str(report)]
    result = runner.invoke(cli, [*args, "--json", "--min-exact-match", "1"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert {name: s["prompts"] for name, s in payload["sets"].items()} == {"raw": 1, "chat": 1}
    assert (
        payload["sets"]["chat"]["exact_match_rate"] == 1.0 and payload["sets"]["chat"]["acceptance_rate"] >= 0
    )
    chat = payload["prompts"][1]
    assert chat["prompt_set"] == "chat"
    assert (
        chat["reference_ids"]
        == hf_greedy(target, template_ids(tokenizer, CHAT_LINE["messages"]), 6)[: len(chat["reference_ids"])]
    )
    markdown = report.read_text()
    assert "## Per prompt set" in markdown and "| chat | 1 | 1.000 |" in markdown


def test_bench_reports_acceptance_per_prompt_set(runner, chat_pair, tmp_path):
    recipe = chat_pair[0]
    prompts = tmp_path / "raw.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n')
    args = ["bench", str(recipe), "--prompts", str(prompts), "--max-tokens", "4", "--num-draft-tokens", "2"]
    result = runner.invoke(cli, [*args, "--draft-cost-ratio", "0.5", "--out", str(tmp_path / "b"), "--chat"])
    assert result.exit_code == 0, result.output
    point = next(
        p for p in json.loads((tmp_path / "b" / "bench.json").read_text())["points"] if p["num_draft_tokens"]
    )
    assert list(point["acceptance_by_set"]) == ["chat"]
    assert point["acceptance_by_set"]["chat"]["acceptance_rate"] == point["acceptance_rate"]
    assert "## Acceptance per prompt set" in (tmp_path / "b" / "bench.md").read_text()
    assert "acceptance per prompt set" in result.output
