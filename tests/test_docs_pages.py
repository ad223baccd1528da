"""The manual's generated pages (docs_tools/pages.py) follow the code: a changed declaration
changes the page, and every name of each vocabulary, case, command, known failure and
reproducer is on its page."""

from __future__ import annotations

from docs_tools import pages
from suite.conformance import catalog
from suite.plugins import registry
from suite.plugins.declarations import FEATURE_MEANINGS, MASK_FORMS, POLICIES, Deviation


def _numpy_entries():
    from implementations.numpy.mha import NumpyMHA

    reg = registry.Registry()
    reg.register(NumpyMHA, "builtin")
    return sorted(reg.entries.items())


def test_a_changed_declaration_changes_the_builtins_page_and_the_findings(monkeypatch):
    from implementations.numpy.mha import NumpyMHA

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
    assert "| `mine.gone` | unavailable | No module named 'gone' | | |" in page


def test_the_builtins_page_has_one_section_per_framework_folder():
    page = pages.builtins_page(_numpy_entries())
    assert "## NumPy {#framework-numpy}" in page and "### `numpy` {#builtin-numpy}" in page
    assert page.index("## NumPy") < page.index("| [`numpy`](#") < page.index("### `numpy`")


def test_every_vocabulary_case_and_command_is_on_its_page():
    forms, policies, cases = pages.mask_forms_page(), pages.policies_page(), pages.cases_page()
    assert all(f"| `{form}` |" in forms for form in MASK_FORMS)
    assert all(f"| `{b}` | `{p}` |" in policies for b, ps in POLICIES.items() for p in ps)
    assert all(f"| `{c.name}` | {c.seed} |" in cases for c in catalog.ALL)
    features = pages.features_page()
    assert all(f"| `{f}` |" in features for f in FEATURE_MEANINGS)
    cli_page = pages.cli_page()
    for command in ("list", "check", "sweep", "report", "run", "repro", "compare"):
        assert f"## mha-suite {command}\n" in cli_page, command


def test_the_findings_list_every_record_and_reproducer_one_section_per_library():
    from suite.conformance.known_failures import read_records
    from suite.plugins.known_behaviours import KNOWN_BEHAVIOURS

    page = pages.findings_page(_numpy_entries())
    records = [r for path in pages.KNOWN_FILES for r in read_records(path)]
    assert len(records) > 30
    missing = [r.name for r in records if f"`{r.name}`" not in page]
    assert not missing, missing
    for folder in sorted(p.name for p in pages.REPRO.iterdir() if p.is_dir()):
        assert f"docs/repro/{folder}/" in page, folder
    assert all(f"`{k.name}`" in page for k in KNOWN_BEHAVIOURS)
    sections = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["torch", "transformers"] and len(sections) == len(set(sections))
    assert {r.library for r in records} <= set(sections)


def test_a_finding_is_a_card_with_its_upstream_issue_as_a_link(monkeypatch, tmp_path):
    known = tmp_path / "mine.toml"
    known.write_text(
        '[[failure]]\nname = "planted-card"\nimplementation = ["torch.sdpa", "torch.nn"]\n'
        'dtype = "float16"\ncases = ["masking/fully_masked_*"]\ncondition = "torch<2.5"\n'
        'kind = "bug"\nlibrary = "torch"\nversions = "torch 2.4.1"\n'
        'upstream = "https://github.com/pytorch/pytorch/issues/12345"\n'
        'reproducer = "docs/repro/torch-flex-small-shapes/"\nreason = "a planted reason"\n'
        'detail = "the planted detail"\n')
    monkeypatch.setattr(pages, "KNOWN_FILES", (known,))
    page = pages.findings_page(_numpy_entries())
    assert '## torch\n\n!!! bug "FlexAttention returns wrong outputs' in page  # its README
    card = page[page.index("## torch") + 10:].split("\n!!!")[0].split("\n## ")[0]
    for text in ("**What**: a planted reason",
                 "`torch.sdpa`, `torch.nn` · cases `masking/fully_masked_*` · devices any · "
                 "dtypes `float16`", "**Holds**: torch<2.5", "**Versions**: torch 2.4.1",
                 "**Upstream**: [pytorch/pytorch #12345]"
                 "(https://github.com/pytorch/pytorch/issues/12345)",
                 "(repro/torch-flex-small-shapes/README.md)", '??? note "Measured"',
                 "the planted detail"):
        assert text in card, text


