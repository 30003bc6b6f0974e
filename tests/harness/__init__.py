"""The test harness that stands in for TensorRT-LLM behind the tensorrtllm runtime's orchestrator.

``steps.StepModel`` answers the engine calls with the PyTorch engine, ``engine_model`` serves it as the Triton
models `tensorrt_llm` / `tensorrt_llm_draft` (config template ``engine_config.pbtxt``), and ``repo.deploy_harness``
writes the tensorrtllm runtime's repository with those two models in place of the C++ backend's.
"""
