"""Vocab rows of a draft/target pair: how many logit rows each model has under a runtime, which pairs of rows a
runtime can serve, and the ids the draft is shown. The rules every place that builds, checks or runs a pair
applies (the build plan, check, the repository, the Triton orchestrator, the in-process runner).

The pair shares one tokenizer; rows past it are padding no text produces (Qwen2.5: 151936 draft rows, 152064
target rows).
"""

from __future__ import annotations

# modelopt pads the AWQ vocab (embedding and lm_head rows) to a multiple of this.
AWQ_VOCAB_PADDING = 64


def padded_vocab_size(vocab_size: int, world_size: int, quantization: str) -> int:
    """Logit rows of a TensorRT-LLM engine: AWQ formats pad the lm_head to a multiple of 64 as nvidia-modelopt 0.37
    exports them (``postprocess.pad_embedding_lm_head``), and the runtime pads every engine's logits to a multiple
    of its world size, tp_size x pp_size (``ModelConfig::getVocabSizePadded(worldConfig.getSize())``: the draft
    logits buffer a verification copies into is that wide)."""
    if quantization in ("int4_awq", "w4a8_awq"):
        vocab_size = -(-vocab_size // AWQ_VOCAB_PADDING) * AWQ_VOCAB_PADDING
    return -(-vocab_size // world_size) * world_size


def vocab_rows(vocab_size: int, runtime: str, world_size: int, quantization: str) -> int:
    """Logit rows a model has under ``runtime``: a TensorRT engine's padded logits (``world_size``: its tp_size x
    pp_size), else the checkpoint's own."""
    if runtime == "tensorrtllm":
        return padded_vocab_size(vocab_size, world_size, quantization)
    return vocab_size


def vocab_pair_problem(
    target_rows: int, draft_rows: int, runtime: str, use_draft_logits: bool, fast_logits: bool
) -> str | None:
    """Why ``runtime`` cannot serve a pair whose models have these vocab rows (None: it can).

    What TensorRT-LLM 1.2.x does with such a pair (read from its sources):
    - draft tokens go to the target by id and are accepted by id (``acceptDraftTokensKernel``): no vocab check;
    - draft logits are copied into a ``[k, target vocabSizePadded]`` buffer and a different size throws
      "Incompatible buffer sizes" (TensorRT-LLM issue 2789); the rows are softmaxed first, so draft logits padded
      with -inf to the target's rows are valid, which the orchestrator and the runner do;
    - fast logits go from the draft rank to the target rank as they are, so nothing can pad them;
    - the PyTorch backend's DraftTarget subtracts the draft's probabilities from the target's at a rejected
      sampled token (``sample_rejected``): a size error for different rows;
    - no runtime checks draft token ids against the target's rows, so a draft with more rows could make the target
      embed an id it has no row for.
    """
    if target_rows == draft_rows:
        return None
    if draft_rows > target_rows:
        return (
            f"the draft has {draft_rows} vocab rows and the target {target_rows}: the draft could propose ids the "
            "target has no rows for; use a draft whose vocab_size does not exceed the target's"
        )
    if runtime == "trtllm-pytorch":
        return (
            f"TensorRT-LLM's DraftTarget (PyTorch backend) subtracts the draft's probabilities ({draft_rows} rows) "
            f"from the target's ({target_rows}) at a rejected sampled token, a size error; serve this pair with "
            "runtime torch or tensorrtllm"
        )
    if runtime == "tensorrtllm" and use_draft_logits and fast_logits:
        return (
            f"triton.fast_logits passes the draft's logits ({draft_rows} rows) to the target rank unchanged and "
            f"TensorRT-LLM refuses them for the target's {target_rows} rows; set triton.fast_logits: false (the "
            "orchestrator then pads them with -inf)"
        )
    return None


def draft_input_ids(tokens: list[int], draft_rows: int) -> list[int]:
    """The sequence as the draft sees it: an id it has no row for (one of a padded-vocabulary target's padding
    rows, which only an untrained or unlucky target samples) becomes the draft's own last row, padding too. The
    draft's view only steers its proposals and the target decides every token, so outputs do not change."""
    if not tokens or max(tokens) < draft_rows:
        return tokens
    return [t if t < draft_rows else draft_rows - 1 for t in tokens]
