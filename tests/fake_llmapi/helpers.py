"""Stand-in for upstream's triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py (see model.py)."""

from __future__ import annotations

import numpy as np


def scalar(request, name: str, default=None):
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item()


def tensor(name: str, value, dtype) -> object:
    import triton_python_backend_utils as pb_utils

    return pb_utils.Tensor(name, np.array([value], dtype=dtype))
