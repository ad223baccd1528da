"""The manual's generated pages: reference tables and the findings catalogue, from the code.

Each function returns one page's Markdown; ``docs_tools/gen_pages.py`` (run by mkdocs-gen-files
during ``mkdocs build``) writes them into the site. Nothing here is written by hand: the
built-ins come from the registry, the cases from ``suite.conformance.catalog``, the vocabularies from
``suite.plugins.interface``, the command line from ``suite.cli``'s parsers, and the findings from the
known-failure records, ``suite.plugins.known_behaviours`` and the built-ins' declared deviations.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from docs_tools import measured

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "docs" / "repro"
KNOWN_FILES = (ROOT / "suite" / "conformance" / "known_failures.toml",
               ROOT / "suite" / "conformance" / "known_failures_compat.toml")
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
    from suite.plugins import registry

    reg = registry.build(builtins=True, entry_points=False, env={})
    return sorted(reg.entries.items())


FRAMEWORK_TITLES = {"numpy": "NumPy", "torch": "PyTorch", "jax": "JAX and Flax", "keras": "Keras",
                    "hf": "Hugging Face transformers", "kernels": "Kernels: Triton and Pallas"}


def framework_of(entry: Any, name: str) -> str:
    """The folder of ``implementations/`` a built-in lives in (its framework), from its
    registered class path; the name's first part where it is unavailable."""
    from suite.plugins.registry import BUILTINS

    spec = BUILTINS.get(name, "")
    if spec.startswith("implementations."):
        return spec.split(".")[1]
    return {"flax": "jax", "triton": "kernels", "pallas": "kernels"}.get(
        name.split(".")[0].split("[")[0], name.split(".")[0])


def builtins_page(entries: Optional[List[Tuple[str, Any]]] = None) -> str:
    from suite.plugins.interface import declared

    entries = builtin_entries() if entries is None else entries
    out = ["# Built-in implementations", "",
           "Generated from the registry (`suite/plugins/registry.py`) in the environment that built "
           "this site: what `mha-suite list` shows, and what each built-in declares, one section "
           "per framework (the folders of `implementations/`). Devices and dtypes are the ones "
           "its probes ran here; a built-in whose framework is not installed is listed with the "
           "reason.", ""]
    groups: Dict[str, List[Tuple[str, Any]]] = {}
    for name, e in entries:
        groups.setdefault(framework_of(e, name), []).append((name, e))
    order = [f for f in FRAMEWORK_TITLES if f in groups] + sorted(set(groups) - set(FRAMEWORK_TITLES))
    out += ["Frameworks: " + ", ".join(f"[{FRAMEWORK_TITLES.get(f, f)}](#framework-{f})" for f in order)
            + ".", ""]
    for fw in order:
        out += [f"## {FRAMEWORK_TITLES.get(fw, fw)} {{#framework-{fw}}}", "",
                "| name | version | devices | dtypes | deviations |", "|---|---|---|---|---|"]
        for name, e in groups[fw]:
            d = e.description
            if d is None:
                out.append(f"| `{cell(name)}` | unavailable | {cell(e.error)} | | |")
                continue
            dtypes = sorted({t for v in d.dtypes.values() for t in v})
            out.append(f"| [`{cell(name)}`](#{anchor(name)}) | {cell(d.framework)} "
                       f"{cell(d.framework_version)} | {cell(', '.join(d.devices) or 'none')} | "
                       f"{cell(', '.join(dtypes))} | {cell(', '.join(sorted(d.deviations)) or '-')} |")
        for name, e in groups[fw]:
            impl = e.impl if e.description is not None else None
            if impl is None:
                continue
            out += ["", f"### `{name}` {{#{anchor(name)}}}", "", class_doc(type(impl)), ""]
            families = declared(impl, "families")
            out += [f"- **code path**: `{type(impl).__module__}.{type(impl).__qualname__}`",
                    f"- **features**: {code(sorted(e.description.features))}",
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
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


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
    from suite.plugins.conditions import ANYWHERE
    from suite.plugins.declarations import Deviation

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
    from suite.plugins.declarations import MASK_FORMS, MASK_PARTS, WINDOW_FORMS

    out = ["# Mask forms", "", "Generated from `suite.plugins.declarations.MASK_FORMS` (the forms the "
           "`mask_forms` family has a case for) and `MASK_PARTS` (the parts they join with "
           "`+`). A plugin declares the forms its library takes natively in `mask_forms`.", "",
           "| form | what reaches the library | window form |", "|---|---|---|"]
    out += [f"| `{f}` | {cell(d)} | {'yes' if f in WINDOW_FORMS else ''} |"
            for f, d in MASK_FORMS.items()]
    out += ["", "## Parts", "", "| part | meaning |", "|---|---|"]
    out += [f"| `{p}` | {cell(d)} |" for p, d in MASK_PARTS.items()]
    return "\n".join(out) + "\n"


def features_page() -> str:
    from suite.plugins.declarations import FEATURE_MEANINGS, VARIANT_FEATURES
    from suite.spec.variants import ALIBI_CONVENTIONS, BUCKETINGS, SCORE_MODS

    out = ["# Features", "", "Generated from `suite.plugins.declarations.FEATURE_MEANINGS`: "
           "what a plugin may declare in `features`. A case whose problem needs a feature "
           "the plugin does not declare is reported unsupported, never run. The score "
           "variants (`suite.spec.variants`) are applied in one order: scale, cap, ALiBi and the relative "
           "table added, "
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
    from suite.plugins.declarations import POLICIES

    out = ["# Policies", "", "Generated from `suite.plugins.declarations.POLICIES`: the behaviours a plugin "
           "may declare it differs on (`deviations`), and the policies the suite checks for "
           "each. The affected rows must follow the declared policy; every other row must "
           "pass the agreement rule.", "", "| behaviour | policy | what the affected rows give |",
           "|---|---|---|"]
    for behaviour, policies in POLICIES.items():
        out += [f"| `{behaviour}` | `{p}` | {cell(d)} |" for p, d in policies.items()]
    return "\n".join(out) + "\n"


def cases_page() -> str:
    from suite.conformance import catalog

    by_family: Dict[str, list] = {}
    for case in catalog.ALL:
        by_family.setdefault(case.family, []).append(case)
    out = ["# Case catalogue", "", "Generated from `suite.conformance.catalog` (the family "
           "modules under `suite/conformance/families/`): every case with fixed inputs, "
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

# The library whose code a built-in's framework name stands for (hf.* run transformers).
LIBRARY_OF_FRAMEWORK = {"hf": "transformers"}
# Library sections in this order first (the rest alphabetically after them).
LIBRARY_ORDER = ("torch", "transformers", "jax", "flax", "keras", "triton", "numpy")
# A reproducer no record or known behaviour cites: its library, by the folder's first word.
REPRO_LIBRARY = {"torch": "torch", "sdpa": "torch", "hf": "transformers", "pallas": "jax",
                 "jax": "jax", "flax": "flax", "keras": "keras", "triton": "triton"}


def repro_title(name: str) -> str:
    readme = REPRO / name / "README.md"
    if not readme.exists():
        return name
    return readme.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip()


def repro_folder(path: str) -> str:
    """``docs/repro/NAME/...`` -> NAME ("" for no reproducer)."""
    m = re.search(r"docs/repro/([\w.-]+)", path)
    return m.group(1) if m else ""


def upstream_link(url: str) -> str:
    """A Markdown link naming the repository and number of an upstream issue or PR."""
    m = re.match(r"https://github\.com/([\w.-]+/[\w.-]+)/(issues|pull)/(\d+)", url)
    if not m:
        return f"<{url}>"
    what = "PR " if m.group(2) == "pull" else ""
    return f"[{m.group(1)} {what}#{m.group(3)}]({url})"


def kind_of(text: str) -> str:
    """A declared deviation's kind: a bug when its reason says so, else a library behaviour
    (documented or by design) the suite declares as a policy."""
    lowered = text.lower()
    if re.search(r"\bbugs?\b|wrong|ignores|drops|overflow|raises", lowered):
        return "bug"
    return "behaviour"


def _finding_cards(records) -> Dict[str, List[Any]]:
    """{card key: its records}: the records of one finding (``name`` and ``name/N``, split by
    the conversion into cross products) on one card."""
    cards: Dict[str, List[Any]] = {}
    for r in records:
        cards.setdefault(f"{Path(r.source).name}:{r.name.split('/', 1)[0]}", []).append(r)
    return cards


def _joined(values: Iterable[str], none: str = "any") -> str:
    items = list(dict.fromkeys(values))
    return "any" if "*" in items else (code(items) if items else none)


def _card(records: List[Any]) -> List[str]:
    """One finding's card (a Material admonition): what, where it shows, versions, kind,
    upstream, reproducer, and the measured detail folded."""
    r = records[0]
    folder = repro_folder(r.reproducer)
    title = repro_title(folder) if folder else r.reason
    conditions = [x.condition.text() for x in records if x.condition is not None]
    where = (f"{_joined(i for x in records for i in x.implementation)} · cases "
             f"{_joined(c for x in records for c in x.cases)} · devices "
             f"{_joined(d for x in records for d in x.device)} · dtypes "
             f"{_joined(t for x in records for t in x.dtype)}")
    lines = [f'!!! {"bug" if r.kind == "bug" else "info"} "{title.replace(chr(34), chr(39))}"',
             ""]
    body = []
    if folder:
        body.append(f"**What**: {r.reason}")
    body += [f"**Where it shows**: {where}",
             f"**Holds**: {'; '.join(dict.fromkeys(conditions)) if conditions else 'anywhere'}",
             f"**Versions**: {r.versions or 'not recorded'} · **Kind**: {r.kind}",
             f"**Upstream**: {upstream_link(r.upstream) if r.upstream else 'none found'}"]
    if folder:
        body.append(f"**Reproducer**: [`docs/repro/{folder}/`](repro/{folder}/README.md) "
                    f"(`python docs/repro/{folder}/repro.py`)")
    body.append(f"**Record**: `{Path(r.source).name}`: "
                + ", ".join(f"`{x.name}`" for x in records))
    lines += [f"    {line}  " for line in body]  # two spaces: one line each
    if r.detail:
        lines += ["", '    ??? note "Measured"', "", f"        {r.detail}"]
    return lines + [""]


def findings_page(entries: Optional[List[Tuple[str, Any]]] = None) -> str:
    from suite.conformance.known_failures import read_records
    from suite.plugins.known_behaviours import KNOWN_BEHAVIOURS

    entries = builtin_entries() if entries is None else entries
    records = [r for path in KNOWN_FILES for r in read_records(path)]
    cards = _finding_cards(records)
    repros = sorted(p.name for p in REPRO.iterdir() if (p / "repro.py").exists())
    cited = {repro_folder(r.reproducer) for r in records} | {
        repro_folder(k.repro) for k in KNOWN_BEHAVIOURS}
    devs = [(name, LIBRARY_OF_FRAMEWORK.get(e.description.framework, e.description.framework),
             e.description.framework_version, row)
            for name, e in entries if e.description is not None
            for row in deviation_rows(e.impl)]
    by_library: Dict[str, Dict[str, list]] = {}

    def section(library: str) -> Dict[str, list]:
        return by_library.setdefault(library, {"cards": [], "known": [], "repros": [],
                                               "devs": []})

    for group in cards.values():
        section(group[0].library or "other")["cards"].append(group)
    for k in KNOWN_BEHAVIOURS:
        for library in sorted(k.libraries):
            section(library)["known"].append(k)
    for name in repros:
        if name not in cited:
            section(REPRO_LIBRARY.get(name.split("-", 1)[0], "other"))["repros"].append(name)
    for dev in devs:
        section(dev[1])["devs"].append(dev)
    order = [lib for lib in LIBRARY_ORDER if lib in by_library] + sorted(
        set(by_library) - set(LIBRARY_ORDER))
    total = sum(len(s["cards"]) for s in by_library.values())
    out = ["# Findings: what the suite found in real libraries", "",
           "Generated from the known-failure records (`suite/conformance/known_failures.toml`, "
           "and `known_failures_compat.toml` for older versions), "
           "`suite/plugins/known_behaviours.toml` and the built-ins' declared deviations. One section "
           "per library; each finding is a card: what it is, the implementations, cases, "
           "devices and dtypes that show it, where the suite checks it (its condition), the "
           "versions it was measured on, its kind (`bug`, or `behaviour`: documented or by "
           "design), the upstream issue where one was found, and the reproducer: a standalone "
           "script under `docs/repro/` (NumPy and the library only) that the tests run.", "",
           f"{total} findings from {len(records)} records, {len(KNOWN_BEHAVIOURS)} known "
           f"behaviours, {len(repros)} reproducers, {len(devs)} declared deviations. "
           "Libraries: " + " · ".join(f"[{lib}](#{lib})" for lib in order) + ".", ""]
    for library in order:
        s = by_library[library]
        out += [f"## {library}", ""]
        for group in s["cards"]:
            out += _card(group)
        for k in s["known"]:
            folder = repro_folder(k.repro)
            out += [f'!!! bug "{repro_title(folder) if folder else k.name}"', "",
                    f"    **What**: {k.reason}  ",
                    f"    **Where it shows**: every plugin on {code(sorted(k.libraries))} whose "
                    f"call reaches the behaviour (`{k.behaviour}={k.policy}`)  ",
                    f"    **Holds**: {k.where.text()}  ",
                    f"    **Versions**: {k.versions or 'not recorded'} · **Kind**: {k.kind} "
                    f"(a known behaviour, `suite/plugins/known_behaviours.toml`: `{k.name}`)  ",
                    f"    **Upstream**: {upstream_link(k.upstream) if k.upstream else 'none found'}"
                    + ("  " if folder else "")]
            if folder:
                out.append(f"    **Reproducer**: [`docs/repro/{folder}/`]"
                           f"(repro/{folder}/README.md)")
            if k.detail:
                out += ["", '    ??? note "Measured"', "", f"        {k.detail}"]
            out.append("")
        for name in s["repros"]:
            link = (f"[`docs/repro/{name}/`](repro/{name}/README.md)"
                    if (REPRO / name / "README.md").exists() else f"`docs/repro/{name}/repro.py`")
            readme = REPRO / name / "README.md"
            url = re.search(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+",
                            readme.read_text(encoding="utf-8") if readme.exists() else "")
            out += [f'!!! note "{repro_title(name)}"', "",
                    f"    **Reproducer**: {link}: shown by the cases its README names (a "
                    "declared deviation or a kernel of the suite; no known-failure record cites "
                    "it)  ",
                    f"    **Upstream**: {upstream_link(url.group(0)) if url else 'none found'}",
                    ""]
        if s["devs"]:
            out += ["**Declared deviations of the built-ins** (policies the suite checks, see "
                    "[Policies](reference/policies.md); the version this site was built with):",
                    "", "| implementation | version | behaviour = policy | where | kind | reason |",
                    "|---|---|---|---|---|---|"]
            for name, _lib, version, (b, p, w, r) in s["devs"]:
                kind = "the suite's own kernel" if name in OWN_KERNELS else kind_of(r)
                out.append(f"| `{cell(name)}` | {cell(version)} | `{b}={p}` | {cell(w)} | "
                           f"{kind} | {cell(r)} |")
            out.append("")
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
