"""export.executorch[SOURCE]: a torch plugin's module through torch.export and ExecuTorch.

The same path as ``implementations.export.onnx_export`` (the module built and loaded as the
source plugin builds it, its call exported with every tensor and weight a graph input,
cached per shapes and mask kind), but exported with ``torch.export.export`` (non-strict),
lowered with ``executorch.exir.to_edge(...).to_executorch()`` and no delegate, so the
program runs on ExecuTorch's own kernels through ``executorch.runtime.Runtime`` (the
pybindings of the pip wheel). ``executorch`` missing: the names are unavailable.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from implementations.export.onnx_export import ExportPath, exported
from implementations.torch.nn import TorchNN
from implementations.torch.sdpa import TorchSDPA


class ExecuTorchProgram:
    """A loaded ExecuTorch program's ``forward``: ``run(feeds)`` takes the inputs by name,
    in the exported order, and returns the outputs as arrays."""

    def __init__(self, buffer: bytes, names: Sequence[str]) -> None:
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(buffer)
        self.method = self.program.load_method("forward")
        self.input_names = tuple(names)

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        inputs = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.input_names]
        return [np.asarray(t.detach().numpy() if isinstance(t, torch.Tensor) else t)
                for t in self.method.execute(inputs)]


class ExecuTorchPath(ExportPath):
    """``ExportPath`` with torch.export + ExecuTorch in place of torch.onnx + onnxruntime."""

    exporter = "executorch"

    def export_model(self, graph: torch.nn.Module, args: Sequence[torch.Tensor],
                     names: Sequence[str]) -> bytes:
        from executorch.exir import to_edge

        # Export on contiguous examples: ``run`` feeds contiguous tensors, and a program keeps
        # each input's dim order from its example (a broadcast bias is a strided view, dim order
        # (1, 3, 0, 2)), so a strided example makes a program whose portable kernels refuse the
        # contiguous input ("different dim orders", error 0x12 in aten::add.out).
        chatter = io.StringIO()
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
            warnings.simplefilter("ignore")
            program = torch.export.export(graph, tuple(a.contiguous() for a in args),
                                          strict=False)
            return bytes(to_edge(program).to_executorch().buffer)

    def load(self, model: bytes, names: Sequence[str]) -> Any:
        return ExecuTorchProgram(model, names)


# The built-in names: unavailable (one line) where the executorch package is not installed.
# torch.nn's module (nn.MultiheadAttention's decomposed ops) and SDPA's (one
# scaled_dot_product_attention call, which ExecuTorch's portable kernels take whole).
ExportExecuTorchTorchNN = exported(TorchNN, "executorch", module=__name__)
ExportExecuTorchTorchSDPA = exported(TorchSDPA, "executorch", module=__name__)
