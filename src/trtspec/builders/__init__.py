"""HF -> TensorRT-LLM checkpoints (ModelOpt), quantization, engine build plans, the tensorrt_llm adapter, pre-flight checks."""
