"""What the benchmark scripts share, one module per concern; the scripts are run as
`python -m benchmarks.<name>` and import these, never each other."""
