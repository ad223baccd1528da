"""Module names from before the wings still import (a plugin written against them keeps
working), warn with their new name, and hand out the new modules' objects."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

CODE = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
try:
    import {old}
except DeprecationWarning as w:
    print("warned:", w)
warnings.simplefilter("ignore", DeprecationWarning)
from {old_pkg} import {old_leaf} as old
import {new} as new
print("same:", getattr(old, "{attr}") is getattr(new, "{attr}"))
"""


@pytest.mark.parametrize("old,new,attr", [
    ("suite.plugin", "suite.plugins.declarations", "Deviation"),
    ("suite.plugin", "suite.plugins.interface", "Implementation"),
    ("suite.adapters", "suite.plugins.adapters", "split_mask"),
    ("suite.problem", "suite.spec.problem", "make_problem"),
    ("suite.check", "suite.conformance.judge", "run_problem"),
    ("implementations.torch_common", "implementations.torch.common", "TorchCore"),
])
def test_an_old_module_name_warns_and_gives_the_new_objects(old, new, attr):
    pkg, _, leaf = old.rpartition(".")
    code = CODE.format(old=old, old_pkg=pkg, old_leaf=leaf, new=new, attr=attr)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"warned: {old} moved to" in out.stdout and new.rsplit(".", 1)[0] in out.stdout
    assert "same: True" in out.stdout


def test_an_old_name_without_the_attribute_says_where_it_moved():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import suite.registry as old
    with pytest.raises(AttributeError, match="moved to suite.plugins.registry"):
        old.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'not_a_module'"):
        import suite

        suite.not_a_module  # noqa: B018
