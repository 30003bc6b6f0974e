"""Stand-in of tensorrt_llm/commands/build.py: build_model, build_and_save, parallel_build (sequential, no MPI)."""

import copy
import errno
import os

from ..builder import build
from ..models import MODEL_MAP


def build_model(
    build_config, rank=0, ckpt_dir=None, model_config=None, model_cls=None, dry_run=False, **kwargs
):
    model_config = copy.deepcopy(model_config)
    if kwargs.get("logits_dtype") is not None:
        model_config.logits_dtype = kwargs["logits_dtype"]
    assert rank < model_config.mapping.world_size
    rank_config = copy.deepcopy(model_config)
    rank_config.set_rank(rank)
    if model_cls is None:
        assert model_config.architecture in MODEL_MAP, (
            f"Unsupported model architecture: {model_config.architecture}"
        )
        model_cls = MODEL_MAP[model_config.architecture]
    model = (
        model_cls(rank_config)
        if ckpt_dir is None
        else model_cls.from_checkpoint(ckpt_dir, config=rank_config)
    )
    if kwargs.pop("strip_plan", False):
        build_config.use_strip_plan = True
    build_config.use_refit = kwargs.get("refit", False)
    return build(model, build_config)


def build_and_save(
    rank, gpu_id, ckpt_dir, build_config, output_dir, log_level, model_config, model_cls, **kwargs
):
    engine = build_model(build_config, rank, ckpt_dir, model_config, model_cls=model_cls, **kwargs)
    assert engine is not None
    if os.environ.get("FAKE_TRTLLM_CRASH") == "1":
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, f"rank{rank}.engine"), "wb") as f:
            f.write(b"half")
        raise RuntimeError("fake TensorRT-LLM crash in the middle of an engine build")
    if os.environ.get("FAKE_TRTLLM_NO_SPACE") == "1":
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, f"rank{rank}.engine"), "wb") as f:
            f.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(output_dir, f"rank{rank}.engine"))
    engine.save(output_dir)
    return True


def parallel_build(
    model_config, ckpt_dir, build_config, output_dir, workers=1, log_level="info", model_cls=None, **kwargs
):
    for rank in range(model_config.mapping.world_size):
        passed = build_and_save(
            rank,
            rank % workers,
            ckpt_dir,
            build_config,
            output_dir,
            log_level,
            model_config,
            model_cls,
            **kwargs,
        )
        assert passed, "Engine building failed, please check error log."
