"""The README's "Testing your own module" example runs as printed, on both code paths."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT

pytest.importorskip("torch")


def _section_code(title: str, containing: str = "") -> str:
    """The section's first Python block (the first that contains ``containing``)."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return next(b for b in re.findall(r"```python\n(.*?)```", section, re.S) if containing in b)


def _run_example(cli, tmp_path, code: str, max_lines: int, impl: str, *args: str):
    """Run a README block as a plugin under ``mha-suite check`` (float32); its records."""
    __tracebackhide__ = True
    assert len([line for line in code.splitlines() if line.strip()]) <= max_lines, code
    plugin, out = tmp_path / "my_plugin.py", tmp_path / "c.json"
    plugin.write_text(code)
    proc = cli("check", "--plugin", str(plugin), "--impl", impl, "--dtype", "float32",
               "--workers", "0", "--json", str(out), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())["results"]


def test_own_module_example_runs_under_the_conformance_cases(cli, tmp_path):
    records = _run_example(cli, tmp_path, _section_code("Testing your own module"), 20, "mine.*")
    outcome = {(r["impl"], r["family"], r["case"]): r["outcome"] for r in records}
    for impl in ("mine.attention", "mine.attention[weights]"):
        assert sum(o == "pass" for (i, *_), o in outcome.items() if i == impl) > 30, impl
        assert outcome[(impl, "gradients", "plain")] == "pass"
    # The two paths differ where the README says: a query row with no key to attend.
    assert outcome[("mine.attention", "masking", "fully_masked_bool_row")] == "pass"
    assert outcome[("mine.attention[weights]", "masking", "fully_masked_bool_row")] == "deviation"


def test_own_jax_module_example_runs_under_the_conformance_cases(cli, tmp_path):
    """The JAX module on JaxModuleCore: masks, the declared behaviours, gradients."""
    pytest.importorskip("flax")
    code = _section_code("Testing your own module", containing="JaxModuleCore")
    records = _run_example(cli, tmp_path, code, 20, "mine.jax",
                           "-k", "gradients and (plain or masked) or masking and (valid_lens or causal)")
    outcome = {(r["family"], r["case"]): r["outcome"] for r in records}
    for case in ("plain", "masked"):
        assert outcome[("gradients", case)] == "pass", case
    for case in ("valid_lens", "valid_lens_per_query", "causal", "causal_bottom_right_short_query"):
        assert outcome[("masking", case)] == "pass", case
    # jax.nn gives a query row with no key to attend uniform weights: declared, so a deviation.
    assert outcome[("masking", "fully_masked_valid_lens")] == "deviation"


def test_own_gpu_kernel_example_runs_under_the_triton_interpreter(cli, tmp_path):
    pytest.importorskip("triton")
    code = _section_code("Testing your own GPU kernel without a GPU")
    records = _run_example(cli, tmp_path, code, 25, "mine.triton",
                           "-k", "gqa or mqa or one_head or cross")
    outcome = {r["case"]: r["outcome"] for r in records if r["family"] == "shapes"}
    assert {r["device"] for r in records} == {"cpu-interpret"}  # no GPU here: interpreted
    assert all(r["outcome"] == "unsupported" for r in records if r["family"] != "shapes")
    # One program per query row: the interpreter runs each in Python, so a few cases only.
    assert set(outcome) == {"gqa", "gqa_groups_of_2", "mqa", "one_head", "cross_key_ne_value"}
    assert set(outcome.values()) == {"pass"}, outcome
