"""Thin Prefect tasks over `vta_pipeline.steps`: caching, retries, progress, nothing else."""
