"""Shared fixtures: a CliRunner and tiny models built into tmp dirs (see tests/tiny_models.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO_ROOT = Path(__file__).resolve().parents[1]
FAKE_TRTLLM_DIR = Path(__file__).parent / "fake_tensorrt_llm"  # the tensorrt_llm 1.2.x stand-in


def pytest_collection_modifyitems(config, items):
    """Tests marked ``conversion`` run ModelOpt, which needs the pinned conversion stack: elsewhere (the newest
    releases: transformers 5, no nvidia-modelopt) they are skipped with the reason naming that stack. A ``timed``
    test must be ``one_stack`` too: `make test` runs timed tests alone only among the one_stack ones, and a timed
    test on both stacks would run beside other tests."""
    from trtspec.builders.environment import package_versions
    from trtspec.builders.support import conversion_stack_problem

    unpaired = [
        i.nodeid for i in items if i.get_closest_marker("timed") and not i.get_closest_marker("one_stack")
    ]
    if unpaired:
        raise pytest.UsageError(f"marked timed but not one_stack: {', '.join(unpaired)}")
    problem = conversion_stack_problem(package_versions())
    if problem is None:
        return
    skip = pytest.mark.skip(reason=f"the conversion path runs on the pinned stack only: {problem}")
    for item in items:
        if "conversion" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture(scope="session")
def shared_tokenizer_dir(tmp_path_factory) -> Path:
    from tiny_models import make_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory, shared_tokenizer_dir) -> tuple[Path, Path]:
    """(target_dir, draft_dir): Llama target 2x64 and 1x32 draft sharing one tokenizer."""
    from tiny_models import make_model

    root = tmp_path_factory.mktemp("pair")
    target = make_model(
        root / "target", "llama", tokenizer_dir=shared_tokenizer_dir, num_hidden_layers=2, seed=1
    )
    draft = make_model(
        root / "draft",
        "llama",
        tokenizer_dir=shared_tokenizer_dir,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        seed=2,
    )
    return target, draft


@pytest.fixture(scope="session")
def cross_family_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir) whose tokenizers differ (issue 28: drafts with another tokenizer).

    Target: Llama-3.1-style (LlamaForCausalLM 2x64, llama3 rope), its own 300-token byte-level BPE with
    ``<|begin_of_text|>`` prepended, eos ``<|eot_id|>`` (config.json eos list end_of_text/eom_id/eot_id), no pad,
    a Llama 3 chat template; vocab rows = 300. Draft: Qwen2.5-style (Qwen2ForCausalLM 1x32, tied), its own
    330-token BPE of the same corpus, no bos, eos ``<|im_end|>``, pad ``<|endoftext|>``, ChatML; vocab rows 352, more
    than the target's. Read-only: copy it before writing into it (tests/tiny_models.py make_cross_family_pair).
    """
    from tiny_models import make_cross_family_pair

    return make_cross_family_pair(tmp_path_factory.mktemp("crossfamily"))


@pytest.fixture
def fake_trtllm(monkeypatch):
    """Make the tensorrt_llm stand-in importable (here for find_spec, in a child through PYTHONPATH)."""
    monkeypatch.syspath_prepend(str(FAKE_TRTLLM_DIR))
    for knob in (
        "FAKE_TRTLLM_VERSION",
        "FAKE_TRTLLM_DROP_SPECULATIVE",
        "FAKE_TRTLLM_CRASH",
        "FAKE_TRTLLM_NO_SPACE",
    ):
        monkeypatch.delenv(knob, raising=False)
    yield monkeypatch
    # modelopt imports tensorrt_llm when it can: drop the stand-in so later tests see a machine without it.
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory, shared_tokenizer_dir):
    """Target and draft over an 8-token vocabulary, so the target's 2-token joint distribution is enumerable."""
    from tiny_models import make_model

    root = tmp_path_factory.mktemp("smallvocab")
    opts = dict(
        tokenizer_dir=shared_tokenizer_dir,
        vocab_size=8,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
    )
    target = make_model(root / "target", "llama", num_hidden_layers=2, seed=21, **opts)
    draft = make_model(root / "draft", "llama", num_hidden_layers=1, seed=22, **opts)
    return target, draft


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """The shipped demo pair (acceptance about 0.6, so some rounds accept part of their draft) on a real
    tritonserver, torch runtime, one for the module."""
    from triton_server import deploy_tiny_repo, running_server

    from trtspec.recipe import DEMO_DIR

    root = tmp_path_factory.mktemp("demo-serve")
    deploy_tiny_repo((DEMO_DIR / "target", DEMO_DIR / "draft"), root / "repo")
    with running_server(root / "repo", root / "server.log") as server:
        yield server
