"""Small networks for the int8 tests, imported through TVM's real PyTorch frontend.

Each exercises what the quantize and pack rules must handle in real networks: conv with
bias, relu and relu6, residual adds, max and avg pooling, channel concats, a strided
conv, depthwise convs. Their outputs end inside the quantized region (no float tail), so
the TVM build and the numpy integer emulation must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
import tvm
from torch import nn
from tvm.relax.frontend.torch import from_exported_program

from vta_pipeline.passes.quantize import fold_batch_norm

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


class Blocks(nn.Module):
    """stem conv, max pool, residual block, avg-pool/concat branch, strided conv, relu6, depthwise."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.b1 = nn.Conv2d(16, 16, 1)
        self.b2 = nn.Conv2d(16, 16, 1)
        self.down = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 2)
        y = torch.relu(self.c2(torch.relu(self.c1(x))) + x)
        z = torch.cat([self.b1(y), self.b2(nn.functional.avg_pool2d(y, 3, 1, 1))], dim=1)
        z = nn.functional.relu6(self.down(torch.relu(z)))
        return torch.relu(self.dw(z))


def to_relax(model: nn.Module, x: np.ndarray, fold_bn: bool = True) -> tvm.IRModule:
    """Export with weights as constants (what load_module gives the passes), BN folded
    unless `fold_bn` is False."""
    model.eval()
    with torch.no_grad():
        ep = torch.export.export(model, (torch.from_numpy(x),))
    mod = from_exported_program(ep, unwrap_unit_return_tuple=True)
    return fold_batch_norm(mod) if fold_bn else mod


def randomize(model: nn.Module, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def build_run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    from tvm import relax

    from vta_pipeline.passes.pipeline import lower_for_tuning

    ex = tvm.compile(lower_for_tuning(mod), target=TARGET)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def stripes(n: int, seed: int, size: int = 16, noise: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """A labelled synthetic dataset: 4 stripe orientations, random frequency, phase,
    colour and noise. Class = orientation (horizontal, vertical, diagonal, anti-diagonal)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype("float32")
    labels = rng.integers(0, 4, n)
    imgs = np.empty((n, 3, size, size), "float32")
    coords = [yy, xx, (xx + yy) / np.sqrt(2), (xx - yy) / np.sqrt(2)]
    for i, k in enumerate(labels):
        f = rng.uniform(0.5, 1.2)
        pattern = np.sin(coords[k] * f + rng.uniform(0, 2 * np.pi))
        color = rng.uniform(0.3, 1.0, 3).astype("float32")
        imgs[i] = color[:, None, None] * pattern + rng.normal(0, noise, (3, size, size))
    return imgs.astype("float32"), labels


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        )  # fmt: skip
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.f(x), 1), 1))


def train_small_cnn(seconds_budget_steps: int = 300, seed: int = 0) -> tuple[nn.Module, tuple, tuple]:
    """Train SmallCNN on `stripes` (a few seconds on 2 cores); returns model, train, test sets."""
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    train = stripes(2048, seed)
    test = stripes(512, seed + 1)
    model = SmallCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xs, ys = torch.from_numpy(train[0]), torch.from_numpy(train[1])
    rng = np.random.default_rng(seed)
    model.train()
    for _ in range(seconds_budget_steps):
        idx = torch.from_numpy(rng.integers(0, len(xs), 64))
        loss = nn.functional.cross_entropy(model(xs[idx]), ys[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), train, test


def dot_kernel(lanes: int, signed: bool, spec) -> tuple[str, object]:
    """A 32 x 64 by 64 x `lanes` int8 matrix product, its reduction tensorized with the
    target's dot product over `lanes` lanes (uint8 data, or int8 if `signed`), compiled."""
    from tvm import te

    from vta_pipeline.tir import int8_dot

    int8_dot.register()
    a = te.placeholder((32, 64), "int8" if signed else "uint8", name="a")
    b = te.placeholder((16, lanes, 4), "int8", name="b")  # the packed weights' 4i innermost
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute(
        (32, lanes),
        lambda n, i: te.sum(a[n, k].astype("int32") * b[k // 4, i, k % 4].astype("int32"), axis=k),
        name="c",
    )
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    n, i, kk = sch.get_loops(sch.get_sblock("c"))
    k_o, k_i = sch.split(kk, [None, 4])
    sch.reorder(n, k_o, i, k_i)
    sch.decompose_reduction(sch.get_sblock("c"), k_o)
    name = int8_dot.intrinsic_for(tvm.target.Target(spec), lanes, signed)
    sch.tensorize(i, name)
    return name, tvm.compile(sch.mod, target=tvm.target.Target(spec))
