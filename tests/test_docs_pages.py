"""The manual's generated pages (docs_tools/pages.py) follow the code: a changed declaration
changes the page, and every name of each vocabulary, case, command, known failure and
reproducer is on its page."""

from __future__ import annotations

import pytest

from docs_tools import pages
from suite import catalog, registry
from suite.plugin import FEATURE_MEANINGS, MASK_FORMS, POLICIES, Deviation


def _numpy_entries():
    from implementations.numpy_mha import NumpyMHA

    reg = registry.Registry()
    reg.register(NumpyMHA, "builtin")
    return sorted(reg.entries.items())


def test_a_changed_declaration_changes_the_builtins_page_and_the_findings(monkeypatch):
    from implementations.numpy_mha import NumpyMHA

    before = pages.builtins_page(_numpy_entries())
    assert "`nan_padding=confined`" in before and "bool_B1LS" not in before
    monkeypatch.setattr(NumpyMHA, "mask_forms", frozenset({"bool_B1LS"}))
    monkeypatch.setattr(NumpyMHA, "deviations", {
        "fully_masked_rows": Deviation("mean_values", "a planted reason, measured nowhere")})
    entries = _numpy_entries()
    after = pages.builtins_page(entries)
    assert "`bool_B1LS`" in after and "`nan_padding=confined`" not in after
    assert "`fully_masked_rows=mean_values`: a planted reason, measured nowhere" in after
    assert "a planted reason, measured nowhere" in pages.findings_page(entries)


def test_an_unavailable_builtin_is_listed_with_its_reason():
    reg = registry.Registry()
    reg.record_error("mine.gone", "builtin", "No module named 'gone'")
    page = pages.builtins_page(sorted(reg.entries.items()))
    assert "| `mine.gone` | unavailable | No module named 'gone' |" in page


def test_every_vocabulary_case_and_command_is_on_its_page():
    forms, policies, cases = pages.mask_forms_page(), pages.policies_page(), pages.cases_page()
    assert all(f"| `{form}` |" in forms for form in MASK_FORMS)
    assert all(f"| `{b}` | `{p}` |" in policies for b, ps in POLICIES.items() for p in ps)
    assert all(f"| `{c.name}` | {c.seed} |" in cases for c in catalog.ALL)
    features = pages.features_page()
    assert all(f"| `{f}` |" in features for f in FEATURE_MEANINGS)
    cli_page = pages.cli_page()
    for command in ("list", "check", "sweep", "report", "run", "repro"):
        assert f"## mha-suite {command}\n" in cli_page, command


def test_the_findings_list_every_known_failure_and_reproducer():
    page = pages.findings_page(_numpy_entries())
    lines = pages.known_failure_lines()
    assert len(lines) > 40
    missing = [r["pattern"] for r in lines if f"`{pages.cell(r['pattern'])}`" not in page]
    assert not missing, missing
    for folder in sorted(p.name for p in pages.REPRO.iterdir() if p.is_dir()):
        assert f"(repro/{folder}/README.md)" in page, folder
    from suite.known import KNOWN_BEHAVIOURS

    assert all(f"`{k.name}`" in page for k in KNOWN_BEHAVIOURS)


@pytest.mark.parametrize("pattern,impl", [
    ("test_case[[]torch.sdpa-cpu-*-tiles/*[]]", "torch.sdpa"),
    ("test_case[[]hf.gpt2[[]eager*[]]-cpu-*-shapes/self_attention[]]", "hf.gpt2[eager*]"),
    ("*[[]hf.gpt2[[]eager,upcast[]]-cpu-float64*", "hf.gpt2[eager,upcast]"),
    ("test_random_shapes[[]pallas.gpu.flash-cpu-interpret-*[]]", "pallas.gpu.flash"),
])
def test_the_implementation_of_a_known_failure_glob(pattern, impl):
    assert pages.pattern_impl(pattern) == impl
