"""CPU TEST SHIM, never shipped: installed with openjev_torchvision_shim.pth into the test venv
.venv-sglang-torch only (scripts/setup_sglang_torch.sh).

`sglang.srt.configs` imports torchvision. The PyPI torchvision 0.28 wheel's C extension links
libtorch_cuda, which the CPU torch wheel lacks: the extension does not load, its operators are
never defined, and `torchvision._meta_registrations` then fails at import with "operator
torchvision::nms does not exist". Defining the two operator schemas it registers fake kernels
for (nms, qnms) before torchvision loads lets torchvision import; SGLang never calls them (text
models), and calling one fails (no kernel is registered).

The .pth only installs a finder (cheap: torch is not imported at every interpreter start); the
schemas are defined the first time anything imports torchvision.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

_LIBRARY: Any = None  # the torch.library.Library: kept alive (collecting it drops the schemas)


def define_schemas() -> None:
    global _LIBRARY
    if _LIBRARY is not None:
        return
    import torch

    if hasattr(torch.ops.torchvision, "nms"):  # a working torchvision extension defined them
        return
    _LIBRARY = torch.library.Library("torchvision", "DEF")
    _LIBRARY.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARY.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            define_schemas()
        return None  # the ordinary finders load torchvision itself


def install() -> None:
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
