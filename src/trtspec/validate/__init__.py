"""PyTorch reference, output comparisons, acceptance metrics, reports and benchmarks."""
