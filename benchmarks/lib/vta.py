"""The recipe's VTA workloads: resnet18's ten distinct conv workloads and the epilogue our
quantize pass fuses into them (bias, requantize, ReLU)."""

from __future__ import annotations

from vta_pipeline.vta.conv import Epilogue

RESNET18 = [  # (batch, height, width, in_filter, out_filter, kh, kw, pad_h, pad_w, stride_h, stride_w)
    (1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1),
    (1, 56, 56, 64, 128, 3, 3, 1, 1, 2, 2),
    (1, 56, 56, 64, 128, 1, 1, 0, 0, 2, 2),
    (1, 28, 28, 128, 128, 3, 3, 1, 1, 1, 1),
    (1, 28, 28, 128, 256, 3, 3, 1, 1, 2, 2),
    (1, 28, 28, 128, 256, 1, 1, 0, 0, 2, 2),
    (1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 1),
    (1, 14, 14, 256, 512, 3, 3, 1, 1, 2, 2),
    (1, 14, 14, 256, 512, 1, 1, 0, 0, 2, 2),
    (1, 7, 7, 512, 512, 3, 3, 1, 1, 1, 1),
]


EPILOGUE = Epilogue(bias=True, round_add=1 << 8, shift=9, clip_min=0, clip_max=127)
# The residual convs' epilogue (resnet's second conv of a block): + the block's input, shifted
# to the conv's scale, as our quantize pass fuses it.
RESIDUAL_EPILOGUE = Epilogue(bias=True, residual_shift=1, round_add=1 << 8, shift=9, clip_min=0, clip_max=127)
