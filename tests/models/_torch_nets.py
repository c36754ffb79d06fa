"""Small PyTorch classifiers for the converter tests: a CNN with batch norm, and RobustBench-style
PreActResNet-18 and WideResNet with the input normalisation inside the model.

The two residual networks follow the layer layout of RobustBench's ``PreActResNet``
(robustbench/model_zoo/architectures/resnet.py: pre-activation blocks, 1x1 projection shortcuts,
``avg_pool2d(out, 4)`` on 32x32 inputs) and DeepMind's ``DMWideResNet``
(robustbench/model_zoo/architectures/dm_wide_resnet.py: non-persistent mean/std buffers, explicit
``F.pad`` before strided convolutions, ``avg_pool2d(out, 8)``), with the widths as arguments so
that the tests stay small.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2471, 0.2435, 0.2616)


def randomize_bn(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give every batch norm non-trivial running statistics and affine params (eval-mode tests)."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(0.2 * torch.randn(m.num_features, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
                m.weight.copy_(1.0 + 0.2 * torch.randn(m.num_features, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.num_features, generator=g))
    return module.eval()


class SmallCNN(nn.Module):
    """conv-BN-ReLU-maxpool x 2, then a linear layer: [B, C, H, W] -> [B, classes]."""

    def __init__(self, in_ch: int = 3, width: int = 4, classes: int = 10, size: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.fc = nn.Linear(2 * width * (size // 4) ** 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class Normalized(nn.Module):
    """``model((x - mean) / std)`` with mean/std as buffers (RobustBench's normalisation layer)."""

    def __init__(self, model: nn.Module, mean=CIFAR10_MEAN, std=CIFAR10_STD):
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x):
        return self.model((x - self.mean) / self.std)


class PreActBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False))

    def forward(self, x):
        out = F.relu(self.bn1(x))
        short = self.shortcut(x) if hasattr(self, "shortcut") else x
        out = self.conv2(F.relu(self.bn2(self.conv1(out))))
        return out + short


class PreActResNet18(nn.Module):
    """PreActResNet-18 (blocks 2-2-2-2) with widths ``width * (1, 2, 4, 8)``, for 32x32 inputs."""

    def __init__(self, width: int = 4, classes: int = 10):
        super().__init__()
        w = [width, 2 * width, 4 * width, 8 * width]
        self.conv1 = nn.Conv2d(3, w[0], 3, padding=1, bias=False)
        layers, cin = [], w[0]
        for i, c in enumerate(w):
            for j in range(2):
                layers.append(PreActBlock(cin, c, 2 if (i > 0 and j == 0) else 1))
                cin = c
        self.layers = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(w[3])
        self.linear = nn.Linear(w[3], classes)

    def forward(self, x):
        out = self.layers(self.conv1(x))
        out = F.avg_pool2d(F.relu(self.bn(out)), 4)
        return self.linear(out.view(out.size(0), -1))


class TinyResNet(nn.Module):
    """conv -> one pre-activation residual block (stride 2, projection shortcut) -> pool -> linear."""

    def __init__(self, in_ch: int = 1, width: int = 3, classes: int = 3):
        super().__init__()
        self.stem = nn.Conv2d(in_ch, width, 3, padding=1, bias=False)
        self.block = PreActBlock(width, 2 * width, 2)
        self.bn = nn.BatchNorm2d(2 * width)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        out = F.relu(self.bn(self.block(self.stem(x))))
        return self.head(F.adaptive_avg_pool2d(out, 1).flatten(1))


class WideBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, act):
        super().__init__()
        self.bn0, self.act0 = nn.BatchNorm2d(cin), act()
        self.conv0 = nn.Conv2d(cin, cout, 3, stride=stride, padding=0, bias=False)
        self.bn1, self.act1 = nn.BatchNorm2d(cout), act()
        self.conv1 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if cin != cout else None
        self.stride = stride

    def forward(self, x):
        pre = self.act0(self.bn0(x))
        v = F.pad(pre, (1, 1, 1, 1) if self.stride == 1 else (0, 1, 0, 1))  # TF "SAME"
        out = self.conv1(self.act1(self.bn1(self.conv0(v))))
        return out + (self.shortcut(pre) if self.shortcut is not None else x)


class WideResNet(nn.Module):
    """DM-style WideResNet-(6n+4)-k with normalisation buffers, for 32x32 inputs."""

    def __init__(self, depth: int = 10, width: int = 1, base: int = 4, act=nn.SiLU, classes: int = 10):
        super().__init__()
        self.register_buffer("mean", torch.tensor(CIFAR10_MEAN).view(3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CIFAR10_STD).view(3, 1, 1), persistent=False)
        n = (depth - 4) // 6
        ch = [base, base * width, 2 * base * width, 4 * base * width]
        self.init_conv = nn.Conv2d(3, ch[0], 3, padding=1, bias=False)
        blocks, cin = [], ch[0]
        for g, stride in zip(range(3), (1, 2, 2)):
            for j in range(n):
                blocks.append(WideBlock(cin, ch[g + 1], stride if j == 0 else 1, act))
                cin = ch[g + 1]
        self.blocks = nn.Sequential(*blocks)
        self.bn, self.act = nn.BatchNorm2d(ch[3]), act()
        self.logits = nn.Linear(ch[3], classes)
        self.channels = ch[3]

    def forward(self, x):
        out = self.init_conv((x - self.mean) / self.std)
        out = self.act(self.bn(self.blocks(out)))
        out = F.avg_pool2d(out, 8)
        return self.logits(out.view(-1, self.channels))


def smooth_images(n: int, seed: int = 0, block: int = 8, size: int = 32) -> "np.ndarray":
    """[n, size, size, 3] float32 random images made of ``block`` x ``block`` constant squares."""
    rng = np.random.default_rng(seed)
    z = rng.random((n, size // block, size // block, 3), dtype=np.float32)
    return np.kron(z, np.ones((1, block, block, 1), np.float32))


def whiten_head(model: nn.Module, head: nn.Linear, x_nhwc: "np.ndarray", seed: int = 0) -> nn.Module:
    """Data-dependent init of the last layer (as LSUV-style inits do): a random projection of the
    penultimate features standardised on ``x``, so that a random network's logits vary with the
    input (at random init, global average pooling leaves nearly the same features for every input
    and one class wins everywhere)."""
    feats = []
    hook = head.register_forward_hook(lambda mod, inp, out: feats.append(inp[0].detach()))
    with torch.no_grad():
        model.eval()(torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))))
    hook.remove()
    f = feats[0]
    mu, sd = f.mean(0), f.std(0) + 1e-6
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(head.out_features, head.in_features, generator=g) / (sd * head.in_features**0.5)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.copy_(-(w @ mu))
    return model
