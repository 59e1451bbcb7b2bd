"""The networks the CPU benchmarks run, and the pack flags each one needs."""

from __future__ import annotations

# Per model: the input shape, its fp32 pack (region and channel block) and what the int8 path
# needs (see tests/test_vta_networks.py). mobilenet_v2's fp32 packs right after its stem in
# blocks of 8 channels (24 and 144 are not multiples of 16; 8 floats are one AVX2 register):
# its early 1x1 convs at 112x112 and 56x56, the costliest, then get the packed space (13.77
# -> 7.68 ms at 8 trials/task, 6.00 at 16: int8_mnv2_91c424f, mnv2_c8_fdd90ed). resnet18 keeps
# blocks of 16 (6% faster than 8 when the two built networks are timed in turn, r18_c8_fdd90ed).
# mobilenet_v2's int8 packs the same way (the dot product over 8 lanes: 18.84 -> 13.96 ms at 8
# trials/task, mnv2_int8_c8_b84ba78) and calibrates per layer (the global scale saturates it).
# On a CPU with AVX-512 (16 floats to a register, 16 int32 lanes to a VNNI dot product)
# mobilenet_v2 packs in blocks of 16 instead, its 24-channel layers padded to 32 (graph
# pack's --pad-channels; `--block mobilenet_v2=8` keeps the old pack): fp32 9.54 -> 6.03 ms
# on an Intel Xeon with AVX-512 (mnv2_c8_lib_9d75481 vs mnv2_c16_pad_54554f1).
WIDE_BLOCK = {"mobilenet_v2": 16}


MODELS = {
    "resnet18": {"shape": (1, 3, 224, 224), "pack": [], "int8": []},
    "mobilenet_v2": {
        "shape": (1, 3, 224, 224),
        "pack": ["--pack-start", "nn.conv2d", "--pack-start-idx", "0", "--cfactor", "8"],
        "int8": ["--pack-start", "nn.conv2d", "--pack-start-idx", "0", "--cfactor", "8", "--calibrate-mode", "max"],
    },
}


# The packed rows' stem (--stem packed): the stem conv packed too, its image one channel block
# (graph pack's --pack-stem); the int8 rows quantize it and run it on the dot product, the image
# padded to 4 channels. resnet18's
# float stem was its int8 network's gap to ONNX Runtime's (2.38 ms vs ORT's int8 stem at 1.76),
# and the pack after mobilenet_v2's stem took 0.18 ms (intel_sbs_5957b13).
STEM = ["--pack-start", "nn.conv2d", "--pack-start-idx", "0", "--pack-stem"]


STEM_INT8 = ["--skip-conv-layers", "", *STEM]


def set_block(name: str, block: str) -> None:
    """Pack `name` in blocks of `block` channels in fp32 and int8, padding the channels the
    block does not divide (graph pack's --pad-channels)."""
    for kind in ("pack", "int8"):
        args = [a for a in MODELS[name][kind] if a != "--pad-channels"]
        if "--cfactor" in args:
            del args[args.index("--cfactor") : args.index("--cfactor") + 2]
        MODELS[name][kind] = [*args, "--cfactor", str(int(block)), "--pad-channels"]


def fp32_block(name: str) -> int:
    """The channel block of the model's fp32 pack (its --cfactor; VTA's 16 by default)."""
    pack = MODELS[name]["pack"]
    return int(pack[pack.index("--cfactor") + 1]) if "--cfactor" in pack else 16
