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

# mobilenet_v2's packed region on VTA (torchvision, packed from its 10th conv, 24 -> 144): the 20
# knob tasks' workloads, (spec with groups, whether its epilogue adds a residual). The 1x1
# projections that end a block with a skip add it; the depthwise 3x3s have groups = channels.
MOBILENET_V2 = [
    ((1, 56, 56, 144, 144, 3, 3, 1, 1, 2, 2, 144), False),
    ((1, 28, 28, 144, 32, 1, 1, 0, 0, 1, 1, 1), False),
    ((1, 28, 28, 32, 192, 1, 1, 0, 0, 1, 1, 1), False),
    ((1, 28, 28, 192, 192, 3, 3, 1, 1, 1, 1, 192), False),
    ((1, 28, 28, 192, 32, 1, 1, 0, 0, 1, 1, 1), True),
    ((1, 28, 28, 192, 192, 3, 3, 1, 1, 2, 2, 192), False),
    ((1, 14, 14, 192, 64, 1, 1, 0, 0, 1, 1, 1), False),
    ((1, 14, 14, 64, 384, 1, 1, 0, 0, 1, 1, 1), False),
    ((1, 14, 14, 384, 384, 3, 3, 1, 1, 1, 1, 384), False),
    ((1, 14, 14, 384, 64, 1, 1, 0, 0, 1, 1, 1), True),
    ((1, 14, 14, 384, 96, 1, 1, 0, 0, 1, 1, 1), False),
    ((1, 14, 14, 96, 576, 1, 1, 0, 0, 1, 1, 1), False),
    ((1, 14, 14, 576, 576, 3, 3, 1, 1, 1, 1, 576), False),
    ((1, 14, 14, 576, 96, 1, 1, 0, 0, 1, 1, 1), True),
    ((1, 14, 14, 576, 576, 3, 3, 1, 1, 2, 2, 576), False),
    ((1, 7, 7, 576, 160, 1, 1, 0, 0, 1, 1, 1), False),
    ((1, 7, 7, 160, 960, 1, 1, 0, 0, 1, 1, 1), False),
    ((1, 7, 7, 960, 960, 3, 3, 1, 1, 1, 1, 960), False),
    ((1, 7, 7, 960, 160, 1, 1, 0, 0, 1, 1, 1), True),
    ((1, 7, 7, 960, 320, 1, 1, 0, 0, 1, 1, 1), False),
]
