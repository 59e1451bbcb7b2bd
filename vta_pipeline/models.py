"""Built-in networks: small, torchvision-style CNNs that need no download.

They exist so that the main job and the tests run in minutes on a 2-core machine while
exercising what matters in real networks: conv + batch norm + relu, max pool, a residual
block, a strided conv, global average pooling and a dense classifier.
"""

from __future__ import annotations


def _torch():
    import torch

    return torch


def build_builtin(name: str):
    """Return (torch.nn.Module, default input shape)."""
    if name not in BUILTIN:
        raise KeyError(name)
    return BUILTIN[name]()


def _tinynet():
    torch = _torch()
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + x)

    class TinyNet(nn.Module):
        """A resnet-shaped network at 1x3x64x64: stem, one block, a strided conv, head."""

        def __init__(self, num_classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 32, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(32)
            self.pool = nn.MaxPool2d(2)
            self.layer1 = BasicBlock(32)
            self.down = nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(64)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(64, num_classes)

        def forward(self, x):
            x = self.pool(torch.relu(self.bn1(self.conv1(x))))
            x = self.layer1(x)
            x = torch.relu(self.bn2(self.down(x)))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return TinyNet(), (1, 3, 64, 64)


def _micronet():
    """Two convs and a head: the smallest network with a real conv task (for tests)."""
    torch = _torch()
    nn = torch.nn

    class MicroNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(16)
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            x = torch.relu(self.conv1(x))
            x = torch.relu(self.bn2(self.conv2(x)))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return MicroNet(), (1, 3, 16, 16)


BUILTIN = {"tinynet": _tinynet, "micronet": _micronet}
