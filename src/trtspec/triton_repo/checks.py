"""Cross-model checks of a rendered repository, which Triton's schema cannot do: every model the orchestrator or
an ensemble calls exists, and every tensor passed between models exists on both sides with the same dtype. An
orchestrator that names no draft model (prompt lookup alone) calls the target engine model only. An entry model
whose draft has its own tokenizer (draft_tokenizer_dir) has a draft, and uses neither draft logits nor draft-ahead.
"""

from __future__ import annotations

from collections.abc import Mapping

from trtspec.core.errors import CheckFailed
from trtspec.triton_repo import interface as names


def _dtype_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(value)


def tensors(config, kind: str) -> dict[str, str]:
    """``kind`` ("input"/"output") tensors of a parsed ModelConfig: name -> dtype name (e.g. TYPE_INT32)."""
    return {t.name: _dtype_name(t.data_type) for t in getattr(config, kind)}


_tensors = tensors


def _check_call(
    caller: str, callee: str, configs: Mapping, sent: Mapping[str, str], read: Mapping[str, str]
) -> None:
    if callee not in configs:
        raise CheckFailed(f"{caller} calls model '{callee}', which the repository does not contain")
    config = configs[callee]
    inputs, outputs = _tensors(config, "input"), _tensors(config, "output")
    for name, dtype in sent.items():
        if name not in inputs:
            raise CheckFailed(f"{caller} sends '{name}' to {callee}, which has no such input")
        if inputs[name] != dtype:
            raise CheckFailed(f"{caller} sends '{name}' as {dtype} to {callee}, which expects {inputs[name]}")
    for name, dtype in read.items():
        if name not in outputs:
            raise CheckFailed(f"{caller} reads '{name}' from {callee}, which has no such output")
        if outputs[name] != dtype:
            raise CheckFailed(
                f"{caller} reads '{name}' as {dtype} from {callee}, which produces {outputs[name]}"
            )
    required = {t.name for t in config.input if not t.optional}
    missing = sorted(required - set(sent))
    if missing:
        raise CheckFailed(f"{callee} requires input(s) {', '.join(missing)} that {caller} never sends")


def _orchestrator_targets(config) -> dict[str, str]:
    """The engine model names the orchestrator's parameters point at (upstream parameter names)."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    return {
        "tensorrt_llm_model_name": params.get("tensorrt_llm_model_name", ""),
        "tensorrt_llm_draft_model_name": params.get("tensorrt_llm_draft_model_name", ""),
    }


def _check_own_tokenizer(config) -> None:
    """A draft with its own tokenizer: there is a draft to translate for; its logits are over another vocabulary
    (acceptance is by point masses) and a guess in its tokens cannot be matched to the target's (no draft-ahead)."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    where = params.get("draft_tokenizer_dir", "")
    if not where:
        return
    draft_key = "draft_model_dir" if "target_model_dir" in params else "tensorrt_llm_draft_model_name"
    if not params.get(draft_key):
        raise CheckFailed(
            f"{names.ORCHESTRATOR} parameter draft_tokenizer_dir is '{where}' but {draft_key} names no draft; "
            "redeploy with `trtspec deploy`"
        )
    for key in ("use_draft_logits", "draft_ahead"):
        if names.parameter_flag(params, key):
            raise CheckFailed(
                f"{names.ORCHESTRATOR} parameter {key} is True beside draft_tokenizer_dir '{where}' (a draft with "
                "its own tokenizer); redeploy with `trtspec deploy`"
            )


def _check_ensemble(name: str, config, configs: Mapping) -> None:
    for step in config.ensemble_scheduling.step:
        if step.model_name not in configs:
            raise CheckFailed(
                f"ensemble {name} has a step on model '{step.model_name}', which does not exist"
            )
        step_cfg = configs[step.model_name]
        for tensor in step.input_map:
            if tensor not in _tensors(step_cfg, "input"):
                raise CheckFailed(
                    f"ensemble {name} maps '{tensor}' into {step.model_name}, which has no such input"
                )
        for tensor in step.output_map:
            if tensor not in _tensors(step_cfg, "output"):
                raise CheckFailed(
                    f"ensemble {name} reads '{tensor}' from {step.model_name}, which has no such output"
                )


def check_repository(configs: Mapping[str, object]) -> None:
    """Raise CheckFailed on the first broken reference between the parsed configs (model name -> ModelConfig)."""
    for name, config in configs.items():
        if config.name != name:
            raise CheckFailed(f"model directory {name} holds a config named '{config.name}'; they must match")
        if config.platform == "ensemble":
            _check_ensemble(name, config, configs)
    orch = configs.get(names.ORCHESTRATOR)
    if orch is None:
        raise CheckFailed(f"the repository has no orchestrator model '{names.ORCHESTRATOR}'")
    for entry in (names.ORCHESTRATOR, names.ENSEMBLE):  # the two names clients written for upstream call
        _check_call("client", entry, configs, names.CLIENT_INPUTS, names.CLIENT_OUTPUTS)
    _check_own_tokenizer(orch)
    if "target_model_dir" in orch.parameters:  # the torch runtime's entry: both models in-process, no BLS
        return
    targets = _orchestrator_targets(orch)
    expected = {
        "tensorrt_llm_model_name": names.TARGET_MODEL,
        "tensorrt_llm_draft_model_name": names.DRAFT_MODEL,
    }
    # No draft model named: prompt lookup proposes alone, and the orchestrator never calls a draft engine.
    lookup_alone = targets["tensorrt_llm_draft_model_name"] == ""
    if lookup_alone and names.DRAFT_MODEL in configs:
        raise CheckFailed(
            f"{names.ORCHESTRATOR} names no draft model, yet the repository holds '{names.DRAFT_MODEL}'; "
            "redeploy with `trtspec deploy`"
        )
    for key, model in targets.items():
        if model != expected[key] and not (lookup_alone and key == "tensorrt_llm_draft_model_name"):
            raise CheckFailed(
                f"{names.ORCHESTRATOR} parameter {key} is '{model}', expected '{expected[key]}'"
            )
    for callee, (sent, read) in names.ORCHESTRATOR_CALLS.items():
        if lookup_alone and callee == names.DRAFT_MODEL:
            continue
        _check_call(names.ORCHESTRATOR, callee, configs, sent, read)
