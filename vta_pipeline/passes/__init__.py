"""Relax passes: the lowering every extraction and build shares (`pipeline`), then one pass per
concern: quantize, graph pack, the packed operators, the CPU layout, Winograd, VTA offload.

One pass per module; each is a plain function over an IRModule (testable without the
pipeline) and a `tvm.ir.transform` module pass.
"""
