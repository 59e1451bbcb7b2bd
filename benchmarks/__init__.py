"""Benchmarks: tuned TVM against PyTorch and ONNX Runtime, and the cost of tuning.

Run each from the repository's root as a module (`uv run python -m benchmarks.compare
--help`); README.md lists them, HISTORY.md every run kept in results/.
"""
