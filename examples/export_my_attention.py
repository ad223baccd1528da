"""Export examples/my_attention.py's module to ONNX, as a user ships it: query, key, value
and a boolean mask (B, 1, L, S) as inputs, batch and lengths dynamic, the output "out".

    python examples/export_my_attention.py my_attention.onnx [--dynamo]
"""

import argparse
import tempfile
from pathlib import Path

import torch

from examples.my_attention import MyAttention


def export(path: str, embed_dim: int = 16, num_heads: int = 4, dynamo: bool = False) -> str:
    module = MyAttention(embed_dim, num_heads).eval()
    # three tensors: given one tensor for key and value, the dynamo exporter reads one graph
    # input for both (the graph's key input is left unused; measured, torch 2.13)
    q, k, v = torch.randn(2, 5, embed_dim), torch.randn(2, 7, embed_dim), torch.randn(2, 7, embed_dim)
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    names = ["query", "key", "value", "mask"]
    dims = {"query": {0: "B", 1: "L"}, "key": {0: "B", 1: "S"}, "value": {0: "B", 1: "S"},
            "mask": {0: "B", 2: "L", 3: "S"}}
    if dynamo:  # torch.export's graph, translated by onnxscript
        B, L, S = (torch.export.Dim(n) for n in "BLS")
        kwargs = {"dynamo": True, "dynamic_shapes": {
            n: {axis: {"B": B, "L": L, "S": S}[d] for axis, d in dims[n].items()} for n in names}}
    else:  # the TorchScript exporter
        kwargs = {"dynamo": False, "dynamic_axes": dims}
    torch.onnx.export(module, (q, k, v, mask), path, input_names=names,
                      output_names=["out"], **kwargs)
    return path


def exported(dynamo: bool = True) -> str:
    """The example's ONNX file, exported once per torch release and exporter (in the temp
    folder), so a plugin module that names it can be loaded again cheaply."""
    path = Path(tempfile.gettempdir()) / "mha-suite-examples" / \
        f"my_attention-{'dynamo' if dynamo else 'torchscript'}-torch{torch.__version__}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        export(str(partial), dynamo=dynamo)
        partial.replace(path)  # whole or not at all: a second process never reads half a file
    return str(path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--dynamo", action="store_true", help="the dynamo exporter")
    args = parser.parse_args()
    print(export(args.path, dynamo=args.dynamo))
