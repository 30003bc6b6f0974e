"""tools/train_demo_pair.py: its copy curriculum, plan overrides and step budget (the training itself runs for minutes
to half an hour)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[1] / "tools" / "train_demo_pair.py"


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("train_demo_pair", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_demo_pair"] = module  # its dataclasses look their module up
    sys.path.insert(0, str(TOOL.parent))  # the tool imports cli_common, its neighbour
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("train_demo_pair", None)
        sys.path.remove(str(TOOL.parent))


def chunk_and_repeat(row: list[int], separator: list[int]) -> tuple[list[int], list[int]]:
    """The row's chunk and what follows its first separator, cut to the chunk's length."""
    for cut in range(1, len(row)):
        if row[cut : cut + len(separator)] == separator:
            chunk = row[:cut]
            after = row[cut + len(separator) :]
            if after[: len(chunk)] == chunk:
                return chunk, after[: len(chunk)]
    raise AssertionError(f"no chunk repeated after {separator} in {row}")


@pytest.mark.parametrize("random_ids", [False, True])
def test_a_copy_row_is_a_chunk_a_blank_line_the_chunk_again_then_the_stream(train, random_ids):
    stream = torch.arange(10_000) % 997 + 4  # no id repeats within a window, so only the copy repeats
    separator = [1, 2]
    gen = torch.Generator().manual_seed(0)
    rows = train.copy_rows(stream, 3, 128, separator, random_ids, gen)
    assert rows.shape == (3, 129)
    for row in rows.tolist():
        chunk, repeat = chunk_and_repeat(row, separator)
        assert 24 <= len(chunk) < 56 and repeat == chunk
        rest = row[2 * len(chunk) + len(separator) :]
        if not random_ids:  # the stream goes on where the chunk ended
            assert rest[0] == chunk[-1] + 1 or (chunk[-1] == 1000 and rest[0] == 4)
        assert min(chunk) >= 4


def test_the_curriculum_gives_random_copies_only_in_its_first_share_of_steps(train):
    plan = train.replace(
        train.Plan(), seq_len=64, batch_size=4, copy_rows=2, random_copy_share=0.5, target_steps=4
    )
    stream = torch.arange(10_000) % 997 + 4
    sample = train.curriculum_sampler(stream, plan, [1, 2])
    gen = torch.Generator().manual_seed(0)
    batches = [sample(gen) for _ in range(4)]

    def in_stream(row: torch.Tensor) -> bool:  # a stream chunk counts up by one (mod 997)
        head = row[:10].tolist()  # within the shortest chunk
        return all((b - 4) == (a - 4 + 1) % 997 for a, b in zip(head, head[1:], strict=False))

    kinds = [[in_stream(row) for row in batch] for batch in batches]
    assert all(batch.shape == (4, 65) for batch in batches)
    assert kinds[0] == kinds[1] == [True, True, True, False]  # 2 windows, a code copy, a random copy
    assert kinds[2] == kinds[3] == [True, True, True, True]


def test_set_overrides_a_numeric_plan_field_with_its_type_and_names_an_unknown_one(train):
    plan = train.override(train.GPU, ["seq_len=512", "batch_size=32", "target_lr=3e-3"])
    assert (plan.seq_len, plan.batch_size, plan.target_lr) == (512, 32, 3e-3)
    assert isinstance(plan.seq_len, int) and plan.copy_rows == train.GPU.copy_rows
    with pytest.raises(SystemExit, match="'seq_lenn'"):
        train.override(train.GPU, ["seq_lenn=3"])
    with pytest.raises(SystemExit, match="'target'"):  # a model shape is not a number
        train.override(train.GPU, ["target=3"])


def test_the_draft_phase_takes_its_own_batch_and_row_length(train):
    plan = train.replace(train.GPU, draft_batch_size=6)
    stream = torch.arange(10_000) % 997 + 4
    pool = torch.zeros(5, 129, dtype=torch.long)  # continuations 128 + 1 long, joint windows 1024
    batch = train.mixed_sampler(stream, pool, plan)(torch.Generator().manual_seed(0))
    assert batch.shape == (6, 129) and (batch[3:] == 0).all() and (batch[:3] != 0).all()


def test_the_step_budget_times_real_steps_and_leaves_the_weights_as_they_were(train):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    stream = torch.arange(2_000) % 60 + 4

    calls = []

    def loss_fn(batch):
        calls.append(batch.shape)
        return {"m": train.next_token_loss(model, batch)}

    def sample(gen):
        return train.sample_batch(stream, 2, 16, gen)

    fast = train.steps_for_budget({"m": (model, 1e-3)}, loss_fn, sample, 10.0)
    assert len(calls) == 13  # 3 warm-up steps and 10 timed ones
    slow = train.steps_for_budget({"m": (model, 1e-3)}, loss_fn, sample, 0.0)
    assert fast > 10 and slow == 1
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())


def test_a_probe_runs_every_probe_every_steps_and_after_the_last_and_never_at_zero(train):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)
    stream = torch.arange(2_000) % 60 + 4

    def loss_fn(batch):
        return {"m": train.next_token_loss(model, batch)}

    def sample(gen):
        return train.sample_batch(stream, 2, 8, gen)

    for every, expected in ((2, [2, 4, 5]), (0, [])):
        probed = []
        train.run_training("t", {"m": (model, 1e-3)}, loss_fn, sample, 5, 0, probed.append, every)
        assert probed == expected, every


def test_set_refuses_a_value_of_the_wrong_type_in_one_line(train):
    with pytest.raises(SystemExit, match="seq_len takes a int, not '1e3'"):
        train.override(train.GPU, ["seq_len=1e3"])


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu", "--copy-curriculum", "--device", "cuda"],  # the shipped pair (TRAINING.md)
        ["--other-tokenizer-drafts"],  # the shipped drafts of another tokenizer
        ["--evaluate"],  # reads the shipped pair, writes nothing
        ["--copying"],
        ["--other-tokenizer-drafts", "--evaluate"],
    ],
)
def test_the_shipped_plans_and_the_measurements_default_to_the_shipped_folder(train, argv):
    assert train.parse_args(argv).out == train.DEFAULT_OUT


@pytest.mark.parametrize(
    "argv",
    [
        [],  # the CPU plan: not what ships
        ["--smoke"],
        ["--copy-curriculum"],
        ["--gpu"],
        ["--gpu", "--copy-curriculum", "--set", "seq_len=512"],
        ["--gpu", "--copy-curriculum", "--budget-s", "60"],
        ["--other-tokenizer-drafts", "--othertok-vocab", "512"],
        ["--other-tokenizer-drafts", "--smoke"],
        ["--other-tokenizer-drafts", "--smoke", "--copying"],  # trains first: no read-only run
        ["--other-tokenizer-drafts", "--othertok-vocab", "512", "--evaluate"],
    ],
)
def test_any_other_run_must_name_its_out_so_it_cannot_replace_the_shipped_pair(train, argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(argv)
    assert exit_info.value.code == 2
    assert "this run needs --out" in capsys.readouterr().err
    assert train.parse_args([*argv, "--out", str(tmp_path)]).out == tmp_path


def test_publish_replaces_the_named_folders_and_leaves_nothing_beside_them(train, tmp_path):
    out = tmp_path / "a" / "pair"
    with train.staging_in(out) as staging:
        assert staging.parent == out  # one file system: the renames below cannot cross devices
        for name in ("target", "draft"):
            (staging / name).mkdir()
            (staging / name / "config.json").write_text(name)
        train.publish(staging, out)
    with train.staging_in(out) as staging:
        (staging / "draft").mkdir()
        (staging / "draft" / "config.json").write_text("new draft")
        train.publish(staging, out, ("draft",))
    assert sorted(p.name for p in out.iterdir()) == ["draft", "target"]
    assert (out / "draft" / "config.json").read_text() == "new draft"
    assert (out / "target" / "config.json").read_text() == "target"
