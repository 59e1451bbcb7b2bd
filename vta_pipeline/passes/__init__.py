"""Relax passes of the int8 VTA path: quantize, graph pack, and the packed operators' lowering.

One pass per module; each is a plain function over an IRModule (testable without the
pipeline) and a `tvm.ir.transform` module pass.
"""
