"""Strict template rendering and Triton's own schema check of every config.pbtxt.

Upstream's fill_template.py leaves an unfilled ``${key}`` in place and the C++ backend silently treats it as
unset; here an unknown key, a missing key or a leftover ``${...}`` is an error at render time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from trtspec.core.errors import CheckFailed

TEMPLATES_DIR = Path(__file__).parent / "templates"
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def template_keys(text: str) -> set[str]:
    """The ``${key}`` names a template uses."""
    return set(_PLACEHOLDER.findall(text))


def format_value(value: object) -> str:
    """Booleans as upstream writes them (``True``/``False``), None as empty (an unset optional parameter). Text
    goes inside a protobuf text-format string, where a backslash or a double quote in a path would be read as
    an escape or end the string: both are escaped, so Triton reads the value as given."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        return ",".join(format_value(v) for v in value)
    return str(value).replace("\\", "\\\\").replace('"', '\\"')


def render_template(text: str, values: Mapping[str, object], where: str) -> str:
    """Substitute every ``${key}`` of ``text``; ``where`` names the template in errors.

    Raises CheckFailed if a key of the template has no value, a value names no key of the template, or a
    ``${...}`` remains after substitution (e.g. one produced by a value).
    """
    keys = template_keys(text)
    bad = sorted(k for k in keys if not _KEY.match(k))
    if bad:
        raise CheckFailed(f"{where}: malformed placeholder ${{{bad[0]}}}; template keys are identifiers")
    missing = sorted(keys - set(values))
    if missing:
        raise CheckFailed(
            f"{where}: no value for template key(s) {', '.join(missing)}; add them to the values"
        )
    unknown = sorted(set(values) - keys)
    if unknown:
        raise CheckFailed(
            f"{where}: unknown template key(s) {', '.join(unknown)}; the template has no such ${{...}}"
        )
    rendered = _PLACEHOLDER.sub(lambda m: format_value(values[m.group(1)]), text)
    leftover = _PLACEHOLDER.search(rendered)
    if leftover:
        raise CheckFailed(
            f"{where}: leftover {leftover.group(0)} after rendering; a value must not contain ${{...}}"
        )
    return rendered


def parse_model_config(text: str, where: str):
    """Parse config.pbtxt text with Triton's ModelConfig schema; returns the ``model_config_pb2.ModelConfig``.

    Unknown fields, wrong types and bad enums raise CheckFailed naming ``where`` and line:column.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as err:
        raise CheckFailed(f"{where}: not a valid Triton model config: {err}") from None


def forwarding_ensemble(name: str, entry):
    """An ensemble ``name`` of one step, ``entry`` (a parsed ModelConfig): the same inputs and outputs under the
    same names, so a client written for either model name calls the other unchanged. Built from the entry's own
    config rather than a template of its own, so the two interfaces cannot drift apart. -> (text, ModelConfig)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = model_config_pb2.ModelConfig(name=name, platform="ensemble", max_batch_size=entry.max_batch_size)
    config.input.extend(entry.input)
    config.output.extend(entry.output)
    step = config.ensemble_scheduling.step.add(model_name=entry.name, model_version=-1)
    for tensor in entry.input:
        step.input_map[tensor.name] = tensor.name
    for tensor in entry.output:
        step.output_map[tensor.name] = tensor.name
    header = f"# trtspec: upstream's `{name}` entry name over {entry.name}, the same inputs and outputs.\n"
    return header + text_format.MessageToString(config), config


def read_template(name: str) -> str:
    """The text of ``templates/<name>`` (e.g. ``tensorrt_llm/config.pbtxt``)."""
    return (TEMPLATES_DIR / name).read_text()
