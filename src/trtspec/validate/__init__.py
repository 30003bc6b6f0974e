"""PyTorch reference, output comparisons, reports and benchmarks (the acceptance metrics are trtspec.core.metrics)."""
