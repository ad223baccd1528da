"""Export paths: a torch plugin's module exported and run by a deployment runtime.

An export is a path of the module it came from: the exported graph and the eager module
must agree on every case both run (DESIGN.md, "Deployment runtimes and export paths").
``exported(MyPlugin, exporter="dynamo")`` makes such a path of any torch plugin class
(``implementations.torch.common.TorchModuleCore`` or ``TorchCore``): the module built and
loaded exactly as ``MyPlugin`` builds it, exported with ``torch.onnx.export`` (``"dynamo"``
or ``"torchscript"``) and run by onnxruntime on the CPU, declaring
``contracts/agrees_with_eager``. See ``implementations.export.onnx_export``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["exported"]


def exported(source: type, exporter: str = "dynamo", **options: Any) -> type:
    """``implementations.export.onnx_export.exported`` (imported on first use: torch, onnx
    and onnxruntime load only when an export path is made)."""
    from implementations.export.onnx_export import exported as make

    return make(source, exporter, **options)
