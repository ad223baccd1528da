"""Known failures as records (suite/conformance/known_failures.py): the loader's one-line
errors, the test ids a record lists, and the short form users keep for their own files."""

from __future__ import annotations

import bisect
import fnmatch
import functools
import re
from pathlib import Path

import pytest

from suite.conformance.known_failures import (
    KNOWN_FAILURES_COMPAT_FILE,
    KNOWN_FAILURES_FILE,
    KnownFailuresError,
    catalogue_tests,
    read_known_failures,
    read_records,
)

ROOT = Path(__file__).resolve().parent.parent
DEVICES = ("cpu", "cpu-interpret", "cuda", "cuda:1")
DTYPES = ("float64", "float32", "float16", "bfloat16")
GOOD = """
[[failure]]
name = "planted"
implementation = "mine.kernel[fast]"
device = "cpu"
dtype = ["float16", "bfloat16"]
cases = ["masking/fully_masked_*", "test_random_shapes"]
condition = "torch>=2.4,<2.5; isa=avx2"
kind = "bug"
library = "torch"
versions = "torch 2.4.1"
upstream = "https://github.com/pytorch/pytorch/issues/1"
reproducer = "docs/repro/x/"
reason = "a planted bug"
"""


def _write(tmp_path, text: str, name: str = "mine.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@functools.lru_cache(maxsize=1)
def _universe() -> list:
    """Every test id of the catalogue: each built-in name (the CUDA-only variants too), each
    device and dtype, each test (a contract under every name a built-in declares)."""
    from suite.conformance.families import contracts
    from suite.plugins import registry

    reg = registry.build(builtins=True, entry_points=False, env={})
    names = set(reg.entries) | {"torch.sdpa[cudnn]", "torch.sdpa[efficient]", "jax.nn[cudnn]"}
    declared = {"other"} | {c.name for e in reg.entries.values() if e.impl is not None
                            for c in contracts.cases_of(e.impl)}
    tests = [(fn, f"contracts/{c}") for fn, p in catalogue_tests() if p == "contracts/*"
             for c in sorted(declared)] + [t for t in catalogue_tests() if t[1] != "contracts/*"]
    return [f"{fn}[{n}-{d}-{t}" + (f"-{p}]" if p else "]")
            for n in sorted(names) for d in DEVICES for t in DTYPES for fn, p in tests]


def _literal_prefix(glob: str) -> str:
    """What every id a glob matches starts with: its text up to the first wildcard (the
    escapes ``[[]`` and ``[]]`` read as the brackets they stand for)."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith(("[[]", "[]]"), i):
            out.append(glob[i + 1])
            i += 3
        elif glob[i] in "*?[":
            break
        else:
            out.append(glob[i])
            i += 1
    return "".join(out)


def _listed(path, ids) -> list:
    """(ids an entry lists, its condition) of each entry of a file, in order. Each glob is
    matched against the ids that start with its literal prefix only (a range of the sorted
    ids): the universe holds about a million ids."""
    ordered = sorted(ids)
    out = []
    for glob, entry in read_known_failures([path]).items():
        rx, prefix = re.compile(fnmatch.translate(glob)), _literal_prefix(glob)
        lo = bisect.bisect_left(ordered, prefix)
        hi = bisect.bisect_left(ordered, prefix + "\U0010ffff", lo)
        out.append((frozenset(i for i in ordered[lo:hi] if rx.match(i)),
                    entry.where.text() if entry.where else None))
    return out


@pytest.mark.parametrize("path", [KNOWN_FAILURES_FILE, KNOWN_FAILURES_COMPAT_FILE])
def test_every_entry_of_the_suites_records_lists_a_test_of_a_builtin(path):
    # The loader checks the cases against the catalogue; this, the names: a built-in renamed
    # or a case moved leaves no record listing nothing. (Converted from the .txt lines with
    # the same ids, entry for entry and condition for condition: commit f17b02f.)
    ids = _universe()
    listed = _listed(path, ids)
    assert listed and all(entry for entry, _where in listed)
    assert len(set().union(*(entry for entry, _where in listed))) > 100


def test_a_record_lists_its_implementation_x_device_x_dtype_x_cases(tmp_path):
    (record,) = read_records(_write(tmp_path, GOOD))
    globs = record.test_globs()
    assert len(globs) == 4
    ids = {"test_case[mine.kernel[fast]-cpu-float16-masking/fully_masked_valid_lens]": True,
           "test_random_shapes[mine.kernel[fast]-cpu-bfloat16]": True,
           "test_case[mine.kernel[fast]-cpu-float32-masking/fully_masked_valid_lens]": False,
           "test_case[mine.kernel-cpu-float16-masking/fully_masked_valid_lens]": False,
           "test_case[mine.kernel[fast]-cpu-interpret-float16-masking/none]": False,
           "test_random_shapes[mine.kernel[fast]-cuda-bfloat16]": False}
    for test, listed in ids.items():
        assert any(fnmatch.fnmatchcase(test, g) for g in globs) is listed, test
    assert record.condition.text() == "torch>=2.4,<2.5; isa=avx2"
    shown = read_known_failures([tmp_path / "mine.toml"])[globs[0]].reason
    assert shown.startswith("a planted bug; reproducer docs/repro/x/; upstream https://")
    assert shown.endswith("[where torch>=2.4,<2.5; isa=avx2]")


@pytest.mark.parametrize("edit,needle", [
    (("reason = \"a planted bug\"", "reason = \"a planted bug\"\nwhy = \"x\""),
     "unknown field(s) why; known: name, implementation"),
    (("kind = \"bug\"\n", ""), "missing required field(s) kind"),
    (("torch>=2.4,<2.5; isa=avx2", "torch>=2.4,<2.5; isa=avx3"), "condition: isa: unknown"),
    (("torch>=2.4,<2.5", "torch=>2.4"), "condition: version condition torch=>2.4: expected"),
    (("torch>=2.4,<2.5; isa=avx2", "torch 2.4"), "condition: condition 'torch 2.4': expected"),
    (("masking/fully_masked_*", "masking/no_such_case"),
     "cases: masking/no_such_case matches no case of the catalogue"),
    (("test_random_shapes", "test_no_such_test"),
     "cases: test_no_such_test matches no case of the catalogue"),
    (("kind = \"bug\"", "kind = \"feature\""), "kind: expected one of bug, behaviour"),
    (("dtype = [\"float16\", \"bfloat16\"]", "dtype = \"float8\""), "dtype: float8 matches none"),
    (("device = \"cpu\"", "device = \"tpu\""), "device: tpu matches none"),
    (("cases = [\"masking/fully_masked_*\", \"test_random_shapes\"]", "cases = []"),
     "cases: expected a string or a non-empty list of strings"),
    (("reason = \"a planted bug\"", "reason = \"\"\"two\nlines\"\"\""), "reason: expected one line"),
    (("reason = \"a planted bug\"", "reason = \"a planted bug\"\nraises = 'Error ('"),
     "raises: expected a regular expression, got 'Error ('"),
])
def test_a_wrong_record_is_one_line_naming_the_file_and_the_record(tmp_path, edit, needle):
    path = _write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(KnownFailuresError) as info:
        read_records(path)
    message = str(info.value)
    assert needle in message, message
    assert "\n" not in message and message.startswith(f"{path}, record 1 (planted): ")


def test_a_file_that_is_not_records_is_one_line(tmp_path):
    for text, needle in (("[[failure]\n", "not valid TOML"),
                         ("[other]\nx = 1\n", "unknown table(s) other"),
                         (GOOD + GOOD, "record 2 (planted): name already used by record 1")):
        with pytest.raises(KnownFailuresError) as info:
            read_records(_write(tmp_path, text))
        assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_short_form_is_read_and_a_malformed_line_is_one_line(tmp_path):
    good = _write(tmp_path, "# mine\ntest_case[[]mine-cpu-*-masking/none[]]  {torch<2.5}  "
                            "# planted\n\n", "mine.txt")
    (entry,) = read_known_failures([good]).values()
    assert entry.reason == "planted [where torch<2.5]" and entry.record is None
    for line, needle in (("test_case[[]mine-cpu-*[]] {torch<2.5  # unclosed", "expected TEST_ID"),
                         ("test_case[[]mine-cpu-*[]] {isa=avx3}  # bad", "unknown level")):
        bad = _write(tmp_path, f"# mine\n{line}\n", "bad.txt")
        with pytest.raises(KnownFailuresError) as info:
            read_known_failures([bad])
        assert str(info.value).startswith(f"{bad}, line 2: ") and needle in str(info.value)
        assert "\n" not in str(info.value)


def test_the_suites_records_are_complete():
    for path in (KNOWN_FAILURES_FILE, KNOWN_FAILURES_COMPAT_FILE):
        records = read_records(path)
        assert records
        for r in records:
            assert r.library and r.versions and len(r.reason) <= 170, r.name
            assert not r.reproducer or (ROOT / r.reproducer).is_dir(), r.name
            assert not r.upstream or r.upstream.startswith("https://github.com/"), r.name
    # the version matrix's records each hold at versions, so one release hides nothing in another
    assert all(r.condition is not None and r.condition.versions
               for r in read_records(KNOWN_FAILURES_COMPAT_FILE))


def test_the_manuals_example_record_reads(tmp_path):
    # docs/verdicts/outcomes.md shows a record users copy: it must load as written.
    page = (ROOT / "docs" / "verdicts" / "outcomes.md").read_text()
    example = re.search(r"```toml\n(.*?)```", page, re.S).group(1)
    (record,) = read_records(_write(tmp_path, example))
    assert record.name == "mine-odd-lengths" and record.condition.versions == {"torch": ">=2.4,<2.5"}


BEHAVIOUR = """
[[behaviour]]
name = "planted-behaviour"
behaviour = "nan_query_rows"
policy = "zero"
libraries = ["torch"]
condition = "torch>=2.13,<2.14; device=cpu"
when = "short_keys_no_attn_mask"
kernel = "aten::_scaled_dot_product_flash_attention_for_cpu"
kernel_when = "no_attn_mask"
kind = "bug"
reason = "a planted behaviour"
"""


def test_a_known_behaviour_record_reads_with_its_named_conditions(tmp_path):
    from suite.plugins.known_behaviours import KERNEL_WHEN, WHEN, read_behaviours

    (k,) = read_behaviours(_write(tmp_path, BEHAVIOUR))
    assert k.where.when is WHEN["short_keys_no_attn_mask"][0]
    assert k.kernel_when is KERNEL_WHEN["no_attn_mask"]
    assert k.where.text().startswith("torch>=2.13,<2.14; device=cpu; fewer keys than one")
    assert k.libraries == {"torch"} and k.reason == "a planted behaviour"


@pytest.mark.parametrize("edit,needle", [
    (("kind = \"bug\"", "kind = \"bug\"\nwhy = 1"), "unknown field(s) why; known: name"),
    (("policy = \"zero\"\n", ""), "missing required field(s) policy"),
    (("\"nan_query_rows\"", "\"nan_rows\""), "behaviour: expected one of"),
    (("policy = \"zero\"", "policy = \"mean\""), "policy: expected one of"),
    (("\"short_keys_no_attn_mask\"", "\"short_keys\""), "when: expected one of"),
    (("\"no_attn_mask\"", "\"no_mask\""), "kernel_when: expected one of"),
    (("device=cpu", "device=cpu; isa=avx3"), "condition: isa: unknown"),
    (("libraries = [\"torch\"]", "libraries = []"), "libraries: expected a list of names"),
])
def test_a_wrong_known_behaviour_is_one_line_naming_the_file_and_the_record(tmp_path, edit,
                                                                          needle):
    from suite.plugins.known_behaviours import DeclarationError, read_behaviours

    path = _write(tmp_path, BEHAVIOUR.replace(*edit))
    with pytest.raises(DeclarationError) as info:
        read_behaviours(path)
    message = str(info.value)
    assert needle in message and "\n" not in message, message
    assert message.startswith(f"{path}, record 1 (planted-behaviour): "), message


def test_the_suites_known_behaviours_are_complete():
    from suite.plugins.known_behaviours import KNOWN_BEHAVIOURS

    assert KNOWN_BEHAVIOURS
    for k in KNOWN_BEHAVIOURS:
        assert k.versions and k.reason and len(k.reason) <= 170, k.name
        assert (ROOT / k.repro).exists() and k.upstream.startswith("https://github.com/"), k.name


RAISES_PLUGIN = """
from implementations.numpy.mha import NumpyMHA


class RaisesOnCausal(NumpyMHA):
    name = "bug.raises_on_causal"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.kinds:
            raise TypeError("an old release's constructor takes no such argument")
        return super().attend(q, k, v, mask, scale, need_weights)
"""


def _causal_record(names: str) -> str:
    """GOOD's record, listing ``names`` on masking/causal in float32 with no condition."""
    return GOOD.replace('"mine.kernel[fast]"', f'"{names}"').replace(
        'dtype = ["float16", "bfloat16"]', 'dtype = "float32"').replace(
        'cases = ["masking/fully_masked_*", "test_random_shapes"]', 'cases = "masking/causal"'
    ).replace('condition = "torch>=2.4,<2.5; isa=avx2"\n', "")


def _check_causal(tmp_path, records: str):
    """bug.raises_on_causal's masking/causal under ``records``: (the run, its record)."""
    import json

    from tests.conftest import run_cli

    known = _write(tmp_path, records)
    done = run_cli("check", "--plugin", str(tmp_path / "plugin.py"), "--impl",
                   "bug.raises_on_causal", "--dtype", "float32", "-k", "masking/causal]",
                   "--workers", "0", "--known-failures", str(known),
                   "--json", str(tmp_path / "c.json"))
    (rec,) = [r for r in json.loads((tmp_path / "c.json").read_text())["results"]
              if r["case"] == "causal"]
    return done, rec


@pytest.mark.parametrize("raises,outcome", [("", "error"), ("old release.s constructor", "known_failure"),
                                            ("something else", "error")])
def test_a_record_covers_an_error_only_where_its_raises_matches(tmp_path, raises, outcome):
    """#52: a record turned a construction TypeError into its own wrong answer."""
    (tmp_path / "plugin.py").write_text(RAISES_PLUGIN)
    record = _causal_record("bug.raises_on_causal")
    if raises:
        record += f"raises = '{raises}'\n"
    done, rec = _check_causal(tmp_path, record)
    assert rec["outcome"] == outcome, rec["reason"]
    assert "old release's constructor" in rec["reason"]
    if outcome == "error":
        assert done.returncode == 1 and "does not cover it" in rec["reason"], done.stdout[-2000:]
    else:
        assert done.returncode == 0 and rec["reason"].startswith("a planted bug"), done.stdout


def test_two_records_of_one_case_for_two_errors_each_cover_their_own(tmp_path):
    """A case listed by two records (one library error each, as hf.model.gemma2[flex]'s
    contract has a CppCompileError record and a soft-cap recompile one): the error is covered
    by the record whose raises matches it, not reported as uncovered by the first listed."""
    (tmp_path / "plugin.py").write_text(RAISES_PLUGIN)
    one = _causal_record("bug.raises_*") + "raises = 'CppCompileError'\n"
    two = one.replace('"bug.raises_*"', '"bug.raises_on_causal"').replace(
        'name = "planted"', 'name = "planted-too"').replace(
        '"a planted bug"', '"the second record"').replace("CppCompileError", "old release")
    done, rec = _check_causal(tmp_path, one + two)
    assert rec["outcome"] == "known_failure", rec["reason"]
    assert rec["reason"].startswith("the second record"), rec["reason"]
    assert done.returncode == 0, done.stdout[-2000:]
