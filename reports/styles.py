"""One look per implementation for the whole report: a marker per family, a colour within it.

The family is what a reader groups implementations by: the library the name starts
with (``hf.bert.sdpa`` -> ``hf``, ``keras.mha[jax]`` -> ``keras``: the registry's names
are ``family.variant``), and for a name without a dot the framework its results record
(a user's ``mymha`` on torch sits with torch), else the name itself. The recorded
framework alone would not do: it names the runtime whose matmul peak and memory method
apply, so Keras on the torch backend and every Hugging Face module record "torch".

Styles are assigned once per report from every implementation in it, in a fixed order
(the suite's own families first, then the others by name; implementations by name), so
an implementation keeps its colour and marker in every chart, whichever subset of
implementations a chart shows. Charts draw one panel per family group (``panel_group``),
so the colours only need to differ within a family: each member takes the next colour of
the palette, and every line is labelled with its name at its end. A family keeps one
colour of its own (``family_colour``) for the tables that group by family.
Pandas-free and matplotlib-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

# The built-in families in the order the report lists them; any other family follows by name.
KNOWN_FAMILIES = ["numpy", "torch", "jax", "keras", "flax", "hf"]
# Colour-blind-safe, distinct in print (Okabe-Ito first, then the tab10 remainder).
COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#8c564b", "#7f7f7f", "#bcbd22", "#17becf", "#9467bd"]
# One marker per family, told apart at 4-5 pt; past the palette a family's members repeat
# the colours with hollow markers.
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "*", "h"]


# Families drawn in one chart panel together (small ones, or kernels of one kind); any
# family not named here and not in KNOWN_FAMILIES shares the "other" panel.
PANEL_GROUPS = {"numpy": "numpy", "torch": "torch", "jax": "jax", "keras": "keras · flax",
                "flax": "keras · flax", "hf": "hf", "pallas": "kernels", "triton": "kernels"}
PANEL_ORDER = ["numpy", "torch", "jax", "keras · flax", "hf", "kernels", "other"]


@dataclass(frozen=True)
class Style:
    family: str
    colour: str
    marker: str
    filled: bool
    family_colour: str = COLOURS[0]

    @property
    def panel(self) -> str:
        """The chart panel the implementation is drawn in (its family's group)."""
        return panel_group(self.family)

    @property
    def key(self) -> Tuple[str, str, bool]:
        """What tells two implementations apart in a chart."""
        return (self.colour, self.marker, self.filled)


def family_of(impl: str, framework: Optional[str] = None) -> str:
    """The family of ``impl``: its name before the first dot, else its framework, else itself."""
    name = str(impl)
    if "." in name:
        return re.split(r"[.\[+]", name, maxsplit=1)[0] or name
    if framework and str(framework) not in ("nan", "None"):
        return str(framework)
    return re.split(r"[\[+]", name, maxsplit=1)[0] or name


def panel_group(family: str) -> str:
    """The chart panel of a family: ``PANEL_GROUPS``, else "other"."""
    return PANEL_GROUPS.get(family, "other")


def panel_order(groups: Iterable[str]) -> List[str]:
    """Panel groups in ``PANEL_ORDER``."""
    present = set(groups)
    return [g for g in PANEL_ORDER if g in present]


def family_order(families: Iterable[str]) -> List[str]:
    """The suite's families in their fixed order, then any others alphabetically."""
    fams = set(families)
    return [f for f in KNOWN_FAMILIES if f in fams] + sorted(fams - set(KNOWN_FAMILIES))


def families(pairs: Iterable[Tuple[str, Optional[str]]]) -> Dict[str, str]:
    """impl -> family for (impl, framework) pairs; a recorded framework wins over none."""
    best: Dict[str, Optional[str]] = {}
    for impl, framework in pairs:
        if impl is None or str(impl) == "nan":
            continue
        if best.get(str(impl)) in (None, "nan", "None"):
            best[str(impl)] = framework
    return {impl: family_of(impl, fw) for impl, fw in best.items()}


def assign(impl_family: Dict[str, str]) -> Dict[str, Style]:
    """impl -> Style: a marker (and table colour) per family in family order, a colour per
    member by name; past the palette, members repeat the colours with hollow markers."""
    order = family_order(impl_family.values())
    out: Dict[str, Style] = {}
    taken: Dict[str, int] = {}  # marker -> colour slots used (past 12 families, markers repeat)
    for f_index, fam in enumerate(order):
        marker = MARKERS[f_index % len(MARKERS)]
        for impl in sorted(i for i, f in impl_family.items() if f == fam):
            slot = taken.get(marker, 0)
            taken[marker] = slot + 1
            out[impl] = Style(fam, COLOURS[slot % len(COLOURS)], marker,
                              filled=(slot // len(COLOURS)) % 2 == 0,
                              family_colour=COLOURS[f_index % len(COLOURS)])
    return out


def ordered(styles: Dict[str, Style]) -> List[str]:
    """Implementations grouped by family (family order), by name within a family."""
    order = {f: i for i, f in enumerate(family_order(s.family for s in styles.values()))}
    return sorted(styles, key=lambda i: (order[styles[i].family], i))
