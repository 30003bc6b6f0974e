"""tools/train_demo_pair.py's copy curriculum: what its rows hold (the training itself runs for half an hour)."""

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
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("train_demo_pair", None)


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
