"""The manual's generated pages: reference tables and the findings catalogue, from the code.

Each function returns one page's Markdown; ``docs_tools/gen_pages.py`` (run by mkdocs-gen-files
during ``mkdocs build``) writes them into the site. Nothing here is written by hand: the
built-ins come from the registry, the cases from ``suite.catalog``, the vocabularies from
``suite.plugin``, the command line from ``suite.cli``'s parsers, and the findings from the
known-failure files, ``suite.known`` and the built-ins' declared deviations.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from docs_tools import measured

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "docs" / "repro"
KNOWN_FILES = (ROOT / "suite" / "conformance" / "known_failures.txt",
               ROOT / "suite" / "conformance" / "known_failures_compat.txt")
# The suite's own kernels: a deviation of theirs is the suite's arithmetic, not a library's.
OWN_KERNELS = ("numpy", "numpy.flash", "torch.eager", "torch.compile", "jax.jit", "triton.flash")


def cell(text: Any) -> str:
    """``text`` fit for one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def code(items: Iterable[str]) -> str:
    return ", ".join(f"`{i}`" for i in items) or "none"


def first_paragraph(doc: Optional[str]) -> str:
    return " ".join(inspect.cleandoc(doc or "").split("\n\n", 1)[0].split())


# -- built-ins ----------------------------------------------------------------------------------

def builtin_entries() -> List[Tuple[str, Any]]:
    """(name, registry entry) of every built-in known here, sorted by name."""
    from suite import registry

    reg = registry.build(builtins=True, entry_points=False, env={})
    return sorted(reg.entries.items())


def builtins_page(entries: Optional[List[Tuple[str, Any]]] = None) -> str:
    from suite.plugin import declared

    entries = builtin_entries() if entries is None else entries
    out = ["# Built-in implementations", "",
           "Generated from the registry (`suite/registry.py`) in the environment that built "
           "this site: what `mha-suite list` shows, and what each built-in declares. Devices "
           "and dtypes are the ones its probes ran here; a built-in whose framework is not "
           "installed is listed with the reason.", "",
           "| name | framework | devices: dtypes | features |", "|---|---|---|---|"]
    for name, e in entries:
        d = e.description
        if d is None:
            out.append(f"| `{cell(name)}` | unavailable | {cell(e.error)} | |")
            continue
        dev = "; ".join(f"{k}: {', '.join(v)}" for k, v in d.dtypes.items())
        out.append(f"| [`{cell(name)}`](#{anchor(name)}) | {cell(d.framework)} "
                   f"{cell(d.framework_version)} | {cell(dev)} | {cell(', '.join(d.features))} |")
    for name, e in entries:
        impl = e.impl if e.description is not None else None
        if impl is None:
            continue
        out += ["", f"## `{name}` {{#{anchor(name)}}}", "",
                class_doc(type(impl)), ""]
        families = declared(impl, "families")
        out += [f"- **code path**: `{type(impl).__module__}.{type(impl).__qualname__}`",
                f"- **mask forms**: {code(sorted(declared(impl, 'mask_forms')))}",
                f"- **layouts**: {code(sorted(declared(impl, 'layouts')))}",
                f"- **key/value source**: `{declared(impl, 'kv_source')}`",
                f"- **families**: {'all' if families is None else code(sorted(families))}"]
        devs = deviation_rows(impl)
        if devs:
            out.append("- **declared deviations**:")
            out += [f"    - `{b}={p}`{' [where ' + w + ']' if w else ''}: {r}"
                    for b, p, w, r in devs]
        else:
            out.append("- **declared deviations**: none")
    return "\n".join(out) + "\n"


def class_doc(cls: type) -> str:
    """The first paragraph of the nearest docstring in ``cls``'s MRO (variants made at run
    time inherit their base's), else its module's."""
    for klass in cls.__mro__:
        if klass.__dict__.get("__doc__"):
            return first_paragraph(klass.__doc__)
    return first_paragraph(inspect.getmodule(cls).__doc__)


def anchor(name: str) -> str:
    return "builtin-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def deviation_rows(impl: Any) -> List[Tuple[str, str, str, str]]:
    """(behaviour, policy, where, reason) of each declared deviation (per dtype too)."""
    from suite.plugin import Deviation
    from suite.where import ANYWHERE

    rows = []
    for behaviour, decl in sorted(impl.deviations.items()):
        items = decl.items() if isinstance(decl, dict) else [(None, decl)]
        for dtype, dev in items:
            if not isinstance(dev, Deviation):
                continue
            where = "" if dev.where == ANYWHERE else dev.where.text()
            if dtype:
                where = f"dtype {dtype}" + (f"; {where}" if where else "")
            rows.append((behaviour, dev.policy, where, dev.reason))
    return rows


# -- vocabularies, cases, command line ------------------------------------------------------------

def mask_forms_page() -> str:
    from suite.plugin import MASK_FORMS, MASK_PARTS, WINDOW_FORMS

    out = ["# Mask forms", "", "Generated from `suite.plugin.MASK_FORMS` (the forms the "
           "`mask_forms` family has a case for) and `MASK_PARTS` (the parts they join with "
           "`+`). A plugin declares the forms its library takes natively in `mask_forms`.", "",
           "| form | what reaches the library | window form |", "|---|---|---|"]
    out += [f"| `{f}` | {cell(d)} | {'yes' if f in WINDOW_FORMS else ''} |"
            for f, d in MASK_FORMS.items()]
    out += ["", "## Parts", "", "| part | meaning |", "|---|---|"]
    out += [f"| `{p}` | {cell(d)} |" for p, d in MASK_PARTS.items()]
    return "\n".join(out) + "\n"


def features_page() -> str:
    from suite.plugin import FEATURE_MEANINGS, VARIANT_FEATURES
    from suite.variants import ALIBI_CONVENTIONS, BUCKETINGS, SCORE_MODS

    out = ["# Features", "", "Generated from `suite.plugin.FEATURE_MEANINGS`: what a plugin may "
           "declare in `features`. A case whose problem needs a feature the plugin does not "
           "declare is reported unsupported, never run. The score variants (`suite.variants`) "
           "are applied in one order: scale, cap, ALiBi and the relative table added, "
           "score_mod, then the mask, then the softmax with the sinks in its denominator; a "
           "row with no key to attend gives a zero head output, with a sink too.", "",
           "| feature | meaning | score variant |", "|---|---|---|"]
    out += [f"| `{f}` | {cell(d)} | {'yes' if f in VARIANT_FEATURES else ''} |"
            for f, d in FEATURE_MEANINGS.items()]
    for title, table in (("ALiBi conventions", ALIBI_CONVENTIONS),
                         ("Relative position bucketings", BUCKETINGS),
                         ("The suite's example score modifiers",
                          {n: m.doc for n, m in SCORE_MODS.items()})):
        out += ["", f"## {title}", "", "| name | meaning |", "|---|---|"]
        out += [f"| `{n}` | {cell(d)} |" for n, d in table.items()]
    return "\n".join(out) + "\n"


def policies_page() -> str:
    from suite.plugin import POLICIES

    out = ["# Policies", "", "Generated from `suite.plugin.POLICIES`: the behaviours a plugin "
           "may declare it differs on (`deviations`), and the policies the suite checks for "
           "each. The affected rows must follow the declared policy; every other row must "
           "pass the agreement rule.", "", "| behaviour | policy | what the affected rows give |",
           "|---|---|---|"]
    for behaviour, policies in POLICIES.items():
        out += [f"| `{behaviour}` | `{p}` | {cell(d)} |" for p, d in policies.items()]
    return "\n".join(out) + "\n"


def cases_page() -> str:
    from suite import catalog

    by_family: Dict[str, list] = {}
    for case in catalog.ALL:
        by_family.setdefault(case.family, []).append(case)
    out = ["# Case catalogue", "", "Generated from `suite.catalog` (`suite/cases.py`, "
           "`suite/mask_forms.py`, `suite/property_cases.py`): every case with fixed inputs, "
           f"{len(catalog.ALL)} in {len(by_family)} families. A case's inputs come from the seed "
           "of its family and name (`Case.seed`), so `mha-suite repro` replays any of them.", ""]
    for family, drawn in sorted(catalog.DRAWN.items()):
        out.append(f"- `{family}`: {cell(drawn)}")
    for family in sorted(by_family):
        out += ["", f"## {family}", "", "| case | seed | what it checks |", "|---|---|---|"]
        out += [f"| `{c.name}` | {c.seed} | {cell(c.doc) or '(no description)'} |"
                for c in by_family[family]]
    return "\n".join(out) + "\n"


def cli_page() -> str:
    import argparse

    from suite import cli

    parser = cli.build_parser()
    out = ["# Command line", "", "Generated from the argparse parsers in `suite/cli.py`.", "",
           "```text", parser.format_help().rstrip(), "```"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += ["", f"## mha-suite {name}", "", "```text",
                        sub.format_help().rstrip(), "```"]
    return "\n".join(out) + "\n"


# -- findings ------------------------------------------------------------------------------------

def known_failure_lines() -> List[Dict[str, Any]]:
    """Each known-failure line of the suite's files: file, pattern, where, reason, and the
    comment block above it (its shared explanation)."""
    from suite.where import split_line

    rows = []
    for path in KNOWN_FILES:
        comment: List[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("#"):
                if rows and rows[-1]["comment_closed"] is False:
                    rows[-1]["comment_closed"], comment = True, []  # a new block begins
                comment.append(line.lstrip("# ").strip())
                continue
            pattern, where, reason = split_line(line)
            if not pattern:
                comment = []
                continue
            rows.append({"file": path.name, "pattern": pattern,
                         "where": where.text() if where is not None else "",
                         "reason": reason or "", "comment": " ".join(comment),
                         "comment_closed": False})
    return rows


def pattern_impl(pattern: str) -> str:
    """The implementation a test-id glob names (``test_case[[]torch.nn-cpu-...]`` -> torch.nn)."""
    plain = pattern.replace("[[]", "[").replace("[]]", "]")  # glob escapes -> brackets
    inner = plain.split("[", 1)[-1]
    inner = inner[:-1] if inner.endswith("]") and inner.count("]") > inner.count("[") else inner
    for dev in ("-cpu-interpret-", "-cpu-", "-cuda", "-*-"):
        if dev in inner:
            return inner.split(dev, 1)[0]
    return inner


def repro_of(text: str) -> str:
    m = re.search(r"docs/repro/([\w.-]+)", text)
    return m.group(1) if m else ""


def upstream_of(text: str) -> str:
    m = re.search(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+", text)
    if m:
        return m.group(0)
    m = re.search(r"\b(pytorch|jax|flax|keras|transformers|triton) #(\d+)", text)
    return f"{m.group(1)} #{m.group(2)}" if m else ""


def versions_in(text: str) -> str:
    found = re.findall(r"\b(torch|jax|flax|keras|transformers|triton) (\d[\w.+]*)", text)
    return ", ".join(dict.fromkeys(f"{lib} {v.rstrip('.')}" for lib, v in found))


def repro_title(name: str) -> str:
    readme = REPRO / name / "README.md"
    if not readme.exists():
        return name
    return readme.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip()


def kind_of(text: str) -> str:
    """A bug when its record says so (or names an upstream issue); else a library behaviour
    (documented or by design) the suite declares."""
    lowered = text.lower()
    if upstream_of(text) or re.search(r"\bbugs?\b|wrong|ignores|drops|overflow|raises", lowered):
        return "bug"
    return "behaviour"


def findings_page(entries: Optional[List[Tuple[str, Any]]] = None) -> str:
    from suite.known import KNOWN_BEHAVIOURS

    entries = builtin_entries() if entries is None else entries
    lines = known_failure_lines()
    repros = sorted(p.name for p in REPRO.iterdir() if (p / "repro.py").exists())
    out = ["# Findings: what the suite found in real libraries", "",
           "Generated from `suite/conformance/known_failures.txt`, "
           "`suite/conformance/known_failures_compat.txt`, `suite.known.KNOWN_BEHAVIOURS` and "
           "the built-ins' declared deviations. Each reproducer under `docs/repro/` is a "
           "standalone script (NumPy and the library only); the tests run every one of them "
           "and report one that no longer shows its behaviour on the pinned versions. "
           "*Kind* is `bug` where the record says so or names an upstream issue, else "
           "`behaviour` (the library's documented or designed answer, declared as a policy).",
           "", f"{len(repros)} reproducers, {len(lines)} known-failure lines, "
           f"{len(KNOWN_BEHAVIOURS)} known behaviours.", "", "## Reproducers", ""]
    for name in repros:
        cited = [r for r in lines if repro_of(r["reason"] + " " + r["comment"]) == name]
        known = [k for k in KNOWN_BEHAVIOURS if name in k.repro]
        devs = [(n, b, p) for n, e in entries if e.description is not None
                for b, p, _w, r in deviation_rows(e.impl) if name in r]
        text = " ".join([r["reason"] + " " + r["comment"] for r in cited] +
                        [k.reason + " " + k.upstream for k in known])
        readme = (REPRO / name / "README.md").read_text(encoding="utf-8")
        upstream = upstream_of(text) or upstream_of(readme)
        out += [f"### {repro_title(name)}", "",
                f"- **reproducer**: [`docs/repro/{name}/`](repro/{name}/README.md) "
                f"(`python docs/repro/{name}/repro.py`)",
                f"- **kind**: {kind_of(text + ' ' + readme)}"
                + (f"; upstream: {upstream}" if upstream else "")]
        impls = sorted({pattern_impl(r["pattern"]) for r in cited} | {n for n, _b, _p in devs})
        if impls:
            out.append(f"- **implementations**: {code(impls)}")
        if cited:
            out.append("- **known failures** (the cases that show it):")
            out += [f"    - `{r['pattern']}`" + (f" [where {r['where']}]" if r["where"] else "")
                    for r in cited]
        for k in known:
            out.append(f"- **known behaviour** `{k.name}` (`{k.behaviour}={k.policy}`) "
                       f"[where {k.where.text()}]")
        if not (cited or known or devs):
            out.append("- shown by the cases its README names (no known-failure line cites it)")
        out.append("")
    out += ["## Known behaviours", "",
            "Declared in `suite/known.py`: a library bug followed into every case of every "
            "plugin on that library, wherever its conditions meet.", ""]
    for k in KNOWN_BEHAVIOURS:
        out += [f"- **`{k.name}`** (`{k.behaviour}={k.policy}`, libraries {code(sorted(k.libraries))},"
                f" where {k.where.text()}): {k.reason}"
                + (f"; reproducer `{k.repro}`" if k.repro else "")
                + (f"; upstream {k.upstream}" if k.upstream else "")]
    for path in KNOWN_FILES:
        rows = [r for r in lines if r["file"] == path.name]
        out += ["", f"## Known failures: `{path.name}`", "",
                "| implementation | test id (glob) | where | versions | kind | reason | reproducer |",
                "|---|---|---|---|---|---|---|"]
        for r in rows:
            text = r["reason"] + " " + r["comment"]
            rep = repro_of(text)
            link = f"[{rep}](repro/{rep}/README.md)" if rep else ""
            out.append(f"| `{cell(pattern_impl(r['pattern']))}` | `{cell(r['pattern'])}` | "
                       f"{cell(r['where'])} | {cell(versions_in(text) or r['where'])} | "
                       f"{kind_of(text)} | {cell(r['reason'])} | {link} |")
    out += ["", "## Declared deviations of the built-ins", "",
            "Each is a policy the suite checks (see [Policies](reference/policies.md)); "
            "the library's version is the one this site was built with.", "",
            "| implementation | library | behaviour = policy | where | kind | reason |",
            "|---|---|---|---|---|---|"]
    for name, e in entries:
        d = e.description
        if d is None:
            continue
        library = f"{d.framework} {d.framework_version}"
        for b, p, w, r in deviation_rows(e.impl):
            kind = "the suite's own kernel" if name in OWN_KERNELS else kind_of(r)
            out.append(f"| `{cell(name)}` | {cell(library)} | `{b}={p}` | {cell(w)} | {kind} | "
                       f"{cell(r)} |")
    return "\n".join(out) + "\n"


def all_pages() -> Dict[str, str]:
    """{path in the site: Markdown} of every generated page."""
    entries = builtin_entries()
    return {"reference/builtins.md": builtins_page(entries),
            "reference/cases.md": cases_page(),
            "reference/mask-forms.md": mask_forms_page(),
            "reference/features.md": features_page(),
            "reference/policies.md": policies_page(),
            "reference/cli.md": cli_page(),
            "findings.md": findings_page(entries),
            "measured.md": measured.page()}
