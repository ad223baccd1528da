"""Charts: seaborn on matplotlib's Agg backend, returned as inline PNG ``data:`` URIs.

Every function takes the measured points (status "ok") in long form and returns a list
of ``Chart``s, one per device and setting (head count, dtype...), so a page with CPU and
CUDA results shows both. Each chart is small multiples: a panel per family group on one
shared scale, every line named at its end, so 25 implementations read without a legend.
"""

from __future__ import annotations

import base64
import functools
import io
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")  # headless: never opens a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from reports.styles import Style, assign, families, ordered, panel_order  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook", font_scale=0.8)
WIDTH_IN = 10.8  # at DPI this fits the page's 1100 px column, so labels keep their size
DPI = 100
PANEL_KEYS = ["dtype", "B", "D", "H"]  # a chart per setting when they vary
DASHES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3))]  # per machine, mask...
WRAP = 2  # panels per row when no column dimension varies
MAX_LINES = 8  # lines (and end labels) per panel: a larger family group is split
LABEL_PT = 7.5  # line labels: 10 px at DPI, read at 1280 px
# Layout in inches: the y-axis margin, the label column right of each panel (fits
# "keras.mha[torch]+weights" at LABEL_PT), the gap before the next panel's ticks, rows.
LEFT_IN, LABEL_IN, WGAP_IN, PANEL_IN, HGAP_IN, TOP_IN, BOTTOM_IN = (
    0.75, 1.55, 0.35, 2.1, 0.5, 0.65, 0.55)


def impl_styles(*frames: pd.DataFrame) -> Dict[str, Style]:
    """One colour and marker per implementation named in ``frames`` (impl, framework)."""
    pairs = [(i, f) for df in frames if not df.empty
             for i, f in zip(df["impl"], df["framework"] if "framework" in df else
                             [None] * len(df))]
    return assign(families(pairs))


def to_data_uri(fig: plt.Figure, tight: bool = True) -> str:
    """The figure as a PNG ``data:`` URI (closes it); ``tight`` crops to what was drawn, at
    the cost of drawing the figure twice."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def panel_label(df: pd.DataFrame, keys: List[str], always: List[str] = ()) -> pd.Series:
    """"dtype=float16 · H=8"-style labels from the keys that vary (or are in ``always``)."""
    shown = [k for k in keys if k in always or df[k].nunique() > 1]
    if not shown:
        return pd.Series("all", index=df.index)
    return df[shown].apply(lambda r: " · ".join(f"{k}={r[k]}" for k in shown), axis=1)


def with_style(df: pd.DataFrame, dims: List[str]) -> Tuple[pd.DataFrame, Optional[str]]:
    """Add the line-style column: the ``dims`` that vary (machine, mask), joined; its name."""
    vary = [c for c in dims if df[c].nunique() > 1]
    if not vary:
        return df, None
    name = " · ".join(vary)
    return df.assign(**{name: df[vary].astype(str).agg(" · ".join, axis=1)}), name


def _guide(ax: plt.Axes, xs: np.ndarray, ys: np.ndarray, power: float, label: str,
           style: str = "--") -> None:
    """A dashed x^power line through the geometric mean of the panel's points."""
    if len(xs) < 2:
        return
    grid = np.sort(np.unique(xs)).astype(float)
    x0, y0 = np.exp(np.log(xs).mean()), np.exp(np.log(ys).mean())
    ax.plot(grid, y0 * (grid / x0) ** power, style, color="0.25", lw=1, alpha=0.6, zorder=0)
    # at the left end: the right margin is the line labels'
    ax.annotate(label, (grid[0], y0 * (grid[0] / x0) ** power), fontsize=8, color="0.25",
                xytext=(3, 3), textcoords="offset points", va="bottom")


def _natural(value: Any) -> List[Any]:
    """A sort key that orders "H=8" before "H=16"."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p)
            for p in re.split(r"(\d+)", str(value))]


def _panels(d: pd.DataFrame, key: Optional[str]) -> List[Any]:
    """The values of ``key`` in natural order (one panel or dash pattern each)."""
    return sorted(d[key].unique(), key=_natural) if key else [None]


@dataclass(frozen=True)
class Chart:
    """One chart of the page: the PNG ``data:`` URI, a title, and the implementation names
    drawn as labels in it (read from the text it drew, in panel order), for the page's
    ``alt`` text and ``data-labels`` attribute."""

    uri: str
    title: str
    labels: List[str]
    note: str = ""  # what the chart leaves out and why, said under it

    @property
    def alt(self) -> str:
        return (f"{self.title}; lines labelled: {', '.join(self.labels) or 'none'}"
                + (f". {self.note}" if self.note else ""))


FLAG_GID = "untrusted:"  # gid prefix of a flagged point's cross: "untrusted:numpy.flash"
FLAG_COLOUR = "#c00000"
LABEL_GID = "label:"  # gid prefix of a line's end label: "label:torch.sdpa"
LEADER_GID = "leader:"  # gid prefix of the leader joining a line's end to its label
LABEL_X = 1.02  # where end labels start, in axes fractions (right of the panel)
TITLE_GID = "panel-title"  # a panel's title: its family group (and column value)


def drawn_labels(fig: plt.Figure) -> List[List[str]]:
    """Per axes of ``fig``, the implementation names its end labels show."""
    return [[t.get_text() for t in ax.texts if str(t.get_gid() or "").startswith(LABEL_GID)]
            for ax in fig.axes]


def to_chart(fig: plt.Figure, title: str, note: str = "") -> Chart:
    """The figure as a Chart (closes it): names read from its labels, first seen first."""
    names = list(dict.fromkeys(n for panel in drawn_labels(fig) for n in panel))
    return Chart(to_data_uri(fig, tight=False), title, names, note)  # _lines fixes the layout


def spread(wanted: np.ndarray, gap: float, low: float, high: float) -> np.ndarray:
    """Positions closest to ``wanted`` (least squares) at least ``gap`` apart, in the input's
    order when sorted, within [low, high] where they fit (else centred on it).

    Isotonic regression of ``wanted - i·gap`` (pool adjacent violators) keeps the order and
    the gaps; clipping the result to the range keeps both.
    """
    order = np.argsort(wanted, kind="stable")
    n = len(wanted)
    q = wanted[order] - gap * np.arange(n)  # (n,) the constraint becomes q non-decreasing
    blocks: List[List[float]] = []  # [sum, count] of pooled values
    for v in q:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = np.concatenate([np.full(int(c), t / c) for t, c in blocks])  # (n,)
    top = high - gap * (n - 1)
    fitted = np.clip(fitted, low, top) if top >= low else np.full(n, (low + top) / 2)
    out = np.empty(n)
    out[order] = fitted + gap * np.arange(n)
    return out


def _label_ends(ax: plt.Axes, ends: Dict[str, Tuple[float, float]], styles: Dict[str, Style],
                logy: bool) -> None:
    """Each implementation's name in the right margin, level with its line's last point
    where it fits, pushed apart just enough that no two names overlap (``spread``), in the
    order of the ends. A leader joins each: dotted along the end's height to the panel's
    right edge (a line that ends early), then to its name. The names keep the ends' order
    and every leader reaches the edge level with its end, so no two leaders cross."""
    if not ends:
        return
    names = sorted(ends)
    to_axes = ax.transAxes.inverted()
    ymin, ymax = ax.get_ylim()
    at = {}  # name -> its end in axes fractions
    for n in names:
        x, y = ends[n]
        y = min(max(y, ymin), ymax)  # a point off the (shared) scale: its label at the edge
        at[n] = to_axes.transform(ax.transData.transform((x, y)))
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    gap = LABEL_PT * 1.25 / height_pt  # one line of text, in axes fractions
    ys = spread(np.asarray([at[n][1] for n in names], float), gap, -0.02, 1.02)
    for n, y in zip(names, ys):
        (xa, ya), colour = at[n], styles[n].colour
        ax.text(LABEL_X, y, n, transform=ax.transAxes, fontsize=LABEL_PT, color=colour,
                va="center", ha="left", clip_on=False, gid=LABEL_GID + n)
        legs = [[(xa, ya), (1.0, ya)]] if xa < 0.995 else []  # along the end's height
        legs.append([(1.0, ya), (LABEL_X - 0.005, y)])  # across the margin to the name
        # in axes fractions, no part of the data limits: autolim would recompute the shared
        # limits of every panel once per leader, to the same values (a third of a chart's
        # drawing time with twenty implementations)
        ax.add_collection(LineCollection(
            legs, colors=colour, linewidths=0.6, alpha=0.6, transform=ax.transAxes,
            linestyles=[":"] * (len(legs) - 1) + ["-"], clip_on=False,
            gid=LEADER_GID + n), autolim=False)


def label_column_in(impls: Any) -> float:
    """The width of the label column right of each panel, in inches: ``LABEL_IN``, or what
    the longest name at ``LABEL_PT`` needs (its drawn width) past the leader."""
    widest = max((_label_width_pt(str(n)) for n in set(impls)), default=0.0)
    return max(LABEL_IN, widest / 72 + 0.3)


@functools.lru_cache(maxsize=4096)
def _label_width_pt(name: str) -> float:
    """The drawn width of ``name`` at ``LABEL_PT``, in points: once per name, not once per
    chart (a text path's extents take about 20 ms, every chart of a page asks for each name)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    return TextPath((0, 0), name, prop=FontProperties(size=LABEL_PT)).get_extents().width


def split_panels(impls: Any, styles: Dict[str, Style]) -> Dict[str, str]:
    """impl -> its panel: its family group (``Style.panel``); a group of more than
    ``MAX_LINES`` implementations split, by name, into as few panels of nearly equal size as
    keep each to ``MAX_LINES`` ("hf (2 of 4)"), so a panel's end labels stay legible."""
    names = sorted({str(i) for i in impls})
    out: Dict[str, str] = {}
    for group in panel_order(styles[n].panel for n in names):
        mine = [n for n in names if styles[n].panel == group]
        parts = -(-len(mine) // MAX_LINES)
        for k, chunk in enumerate(np.array_split(np.array(mine, dtype=object), parts)):
            out.update({str(n): group if parts == 1 else f"{group} ({k + 1} of {parts})"
                        for n in chunk})
    return out


def _lines(d: pd.DataFrame, x: str, y: str, col: Optional[str], dash: Optional[str],
           ylabel: str, xlabel: str, styles: Dict[str, Style], logy: bool = True,
           guides: Optional[Dict[float, str]] = None, col_template: str = "{col_name}",
           sharey: Any = True, flag: Optional[str] = None,
           flag_breaks_line: bool = False) -> plt.Figure:
    """Small multiples: one line per (implementation, ``dash`` value) over log2 x, a row
    of panels per family group (``Style.panel``) and a column per ``col`` value (without
    one, the groups wrap over ``WRAP`` columns), all on one scale.

    Each line is labelled with its implementation's name at its end; the other groups'
    lines are drawn in light grey behind, to compare against on the shared scale. Colour
    and marker come from ``styles`` (the report's one assignment), the dash pattern from
    the ``dash`` column's value (machine, mask, gradients); guides as {power: label}.
    Rows where the boolean column ``flag`` holds get a red cross over their point
    (``FLAG_GID`` + implementation): a value the report does not vouch for; with
    ``flag_breaks_line`` the lines, their end labels and the guides leave those points out
    and the cross is dimmed (a point that would zig-zag the line is not drawn as data).
    """
    panel_of = split_panels(d["impl"], styles)
    d = d.assign(_group=d["impl"].map(panel_of))
    groups, cols = list(dict.fromkeys(panel_of.values())), _panels(d, col)  # panel order
    if col:
        cells = [(g, c) for g in groups for c in cols]
        ncols = len(cols)
    else:
        cells = [(g, None) for g in groups]
        ncols = min(WRAP, len(cells))
    nrows = -(-len(cells) // ncols)
    # tall enough that every panel's names fit one above the other
    most = max(d[d["_group"] == g]["impl"].nunique() for g in groups)
    panel_h = max(PANEL_IN, most * LABEL_PT * 1.25 / 72 + 0.3)
    fig_h = TOP_IN + BOTTOM_IN + nrows * panel_h + (nrows - 1) * HGAP_IN
    label_in = label_column_in(d["impl"])
    axes_w = (WIDTH_IN - LEFT_IN - label_in - (ncols - 1) * (label_in + WGAP_IN)) / ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH_IN, fig_h), sharex=True,
                             sharey=sharey, squeeze=False)
    fig.subplots_adjust(left=LEFT_IN / WIDTH_IN, right=1 - label_in / WIDTH_IN,
                        bottom=BOTTOM_IN / fig_h, top=1 - TOP_IN / fig_h,
                        wspace=(label_in + WGAP_IN) / axes_w, hspace=HGAP_IN / panel_h)
    dashes = {v: DASHES[i % len(DASHES)] for i, v in enumerate(_panels(d, dash))}
    d = d[np.isfinite(d[y]) & (d[y] > 0 if logy else True)]
    d = d.assign(_flagged=d[flag].fillna(False).astype(bool) if flag else False)
    drawn = d[~d["_flagged"]] if flag_breaks_line else d  # what lines and guides go through
    # every line once: (column value, implementation, dash value) -> its x and mean y
    keys = [col or "_group", "impl", dash or "impl"]
    means = drawn.groupby([*keys, x], sort=True)[y].mean()
    lines: Dict[Tuple[Any, str, Any], Tuple[np.ndarray, np.ndarray]] = {
        k: (g.index.get_level_values(x).to_numpy(float), g.to_numpy(float))
        for k, g in means.groupby(level=[0, 1, 2], sort=True)}
    placed: List[Tuple[plt.Axes, Dict[str, Tuple[float, float]]]] = []
    for k, ax in enumerate(axes.flat):
        if k >= len(cells):
            ax.set_visible(False)
            continue
        group, c = cells[k]
        here = {key: v for key, v in lines.items() if c is None or key[0] == c}
        mine = {key: v for key, v in here.items() if panel_of[key[1]] == group}
        context = [np.column_stack(v) for key, v in here.items() if key not in mine]
        # the other groups' lines, in grey behind: one artist for all of them
        ax.add_collection(LineCollection(context, colors="0.86", linewidths=0.8, zorder=0))
        ends: Dict[str, Tuple[float, float]] = {}
        for (_, impl, dv), (xs, vals) in mine.items():
            st = styles[impl]
            ax.plot(xs, vals, color=st.colour, marker=st.marker, markersize=4, lw=1.2,
                    markerfacecolor=st.colour if st.filled else "white",
                    linestyle=dashes[dv] if dash else "-", gid=impl, zorder=2)
            if impl not in ends or vals[-1] > ends[impl][1]:  # the highest of its dashes
                ends[impl] = (xs[-1], vals[-1])
        sub = d if c is None else d[d[col] == c]
        mine_points = sub[sub["_group"] == group]
        if flag:
            for impl, f in mine_points[mine_points["_flagged"]].groupby("impl", sort=True):
                ax.scatter(f[x].to_numpy(float), f[y].to_numpy(float), marker="X", s=70,
                           color=FLAG_COLOUR, edgecolors="white", linewidths=0.6,
                           alpha=0.45 if flag_breaks_line else 1.0,
                           gid=FLAG_GID + str(impl), zorder=3)
        if flag_breaks_line:
            mine_points = mine_points[~mine_points["_flagged"]]
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        for power, label in (guides or {}).items():
            _guide(ax, mine_points[x].to_numpy(float), mine_points[y].to_numpy(float), power,
                   label, "--" if power >= 2 else ":")
        title = group + ("" if c is None else " · " + col_template.format(col_name=c))
        # text, not set_title: a title is placed above the tick labels at every draw (slow)
        ax.text(0.0, 1.03, title, transform=ax.transAxes, fontsize=9, ha="left",
                va="bottom", gid=TITLE_GID)
        ax.set_xlabel(xlabel if k + ncols >= len(cells) else "")
        ax.set_ylabel(ylabel if k % ncols == 0 else "")
        ax.tick_params(labelbottom=True)
        placed.append((ax, ends))
    if not logy:
        for ax, _ in placed:
            ax.set_ylim(bottom=0)
    for ax, ends in placed:  # after every panel is drawn: the shared limits are final
        _label_ends(ax, ends, styles, logy)
    if dash:
        handles = [Line2D([], [], color="0.3", lw=1.2, linestyle=ls) for ls in dashes.values()]
        fig.legend(handles, [str(v) for v in dashes], loc="upper right",
                   bbox_to_anchor=(1.0, 1 - 0.05 / fig_h), ncol=len(dashes),
                   frameon=False, fontsize=8, title=dash, title_fontsize=8,
                   handlelength=2.6, borderaxespad=0.0)
    return fig


def _title(fig: plt.Figure, text: str) -> None:
    """The chart's title in its top margin (the layout is fixed: no tight bounding box)."""
    fig.text(0.01, 1 - 0.08 / fig.get_figheight(), text, ha="left", va="top", fontsize=11)


def length_subset(ok: pd.DataFrame) -> pd.DataFrame:
    """Points whose (device, dtype, B, D, H, mask) group has three or more lengths."""
    keys = ["machine", "device", "dtype", "B", "D", "H", "mask", "grad"]
    n = ok.groupby(keys, dropna=False)["L"].transform("nunique")
    return ok[n >= 3]


def heads_subset(ok: pd.DataFrame) -> pd.DataFrame:
    """Points whose (device, dtype, B, D, L, mask) group has three or more head counts."""
    keys = ["machine", "device", "dtype", "B", "D", "L", "mask", "grad"]
    n = ok.groupby(keys, dropna=False)["H"].transform("nunique")
    return ok[n >= 3]


def _settings(d: pd.DataFrame, keys: List[str], always: List[str]) -> List[Tuple[str, pd.DataFrame]]:
    """(label, points) per setting: the ``keys`` that vary (or are in ``always``) fixed."""
    label = panel_label(d, keys, always)
    return [(str(v), d[label == v]) for v in sorted(label.unique(), key=_natural)]


def _time_charts(subset: pd.DataFrame, keys: List[str], always: List[str], x: str,
                 xlabel: str, guides: Dict[float, str], what: str, guide_note: str,
                 styles: Dict[str, Style]) -> List[Chart]:
    """Log-log median time vs ``x``, a column per mask, one chart per device and setting."""
    out = []
    for device, dev in subset.groupby("device"):
        for setting, d in _settings(dev, keys, always):
            # an implementation timed at one value of x here (a sampled run times some at
            # fewer points) has no line to draw: left out, and said so under the chart
            counts = d.groupby("impl")[x].nunique()
            single = sorted(map(str, counts[counts < 2].index))
            d = d[~d["impl"].isin(single)]
            if d.empty:
                continue
            note = (f"Left out, timed at a single {what} here (no line to draw): "
                    + ", ".join(single) + ".") if single else ""
            d, style = with_style(d.assign(time_ms=d["median_s"] * 1e3), ["machine", "grad"])
            fig = _lines(d, x, "time_ms", "mask", style, "median time per call (ms)", xlabel,
                         styles, guides=guides, col_template="mask: {col_name}")
            title = f"Time vs {what} on {device}, {setting} ({guide_note})"
            _title(fig, title)
            out.append(to_chart(fig, title, note))
    return out


def time_vs_length(ok: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                   ) -> List[Chart]:
    """Log-log median time vs length with an n^2 guide: a column per mask."""
    return _time_charts(length_subset(ok), PANEL_KEYS, ["H"], "L", "sequence length L (= S)",
                        {2.0: "n²"}, "sequence length", "log-log; dashed: n²",
                        styles or impl_styles(ok))


def time_vs_heads(ok: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                  ) -> List[Chart]:
    """Log-log median time vs head count at a fixed length, with a linear guide."""
    return _time_charts(heads_subset(ok), ["dtype", "B", "D", "L"], ["L"], "H",
                        "head count H (E = H·D)", {1.0: "∝ H"}, "head count",
                        "log-log; dotted: linear in H", styles or impl_styles(ok))


def throughput(ok: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
               ) -> List[Chart]:
    """GFLOP/s and share of the measured matmul peak vs length: a column each."""
    styles = styles or impl_styles(ok)
    out = []
    for device, dev in length_subset(ok).groupby("device"):
        for setting, d in _settings(dev, PANEL_KEYS, ["H"]):
            d, style = with_style(d, ["machine", "mask", "grad"])
            # a share the report does not vouch for (frames.untrusted_share) is crossed out
            untrusted = d["share_untrusted"].notna() if "share_untrusted" in d else False
            long = pd.concat([
                d.assign(metric="achieved GFLOP/s", value=d["flops_per_s"] / 1e9,
                         _untrusted=False),
                d.assign(metric="% of measured matmul peak", value=100 * d["peak_share"],
                         _untrusted=untrusted)])
            long = long[np.isfinite(long["value"])]
            if long.empty:
                continue
            fig = _lines(long, "L", "value", "metric", style, "", "sequence length L",
                         styles, logy=False, sharey="col", flag="_untrusted")
            title = f"Throughput on {device}, {setting}: FLOP/s and share of the matmul peak"
            bad = sorted(set(long.loc[long["_untrusted"], "impl"].astype(str)))
            if bad:
                _title(fig, title + "; red ✕: a share not to be trusted (see the headline)")
                out.append(to_chart(fig, title + "; shares not to be trusted (red crosses): "
                                    + ", ".join(bad)))
                continue
            _title(fig, title)
            out.append(to_chart(fig, title))
    return out


def memory_vs_length(ok: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                     ) -> List[Chart]:
    """Log-log peak memory vs length, with linear and quadratic guides."""
    styles = styles or impl_styles(ok)
    out = []
    measured = ok[(ok["peak_bytes"] > 0) & ok["peak_method"].ne("not measured")]
    for device, dev in length_subset(measured).groupby("device"):
        for setting, d in _settings(dev, PANEL_KEYS, ["H"]):
            # a point the report does not vouch for (frames.untrusted_memory): a dim cross,
            # left out of its line
            untrusted = d["memory_untrusted"].notna() if "memory_untrusted" in d else False
            d, style = with_style(d.assign(peak_mib=d["peak_bytes"] / 2**20,
                                           _untrusted=untrusted), ["machine", "mask", "grad"])
            fig = _lines(d, "L", "peak_mib", None, style, "peak memory (MiB)",
                         "sequence length L", styles, guides={1.0: "n", 2.0: "n²"},
                         flag="_untrusted", flag_breaks_line=True)
            title = (f"Peak memory vs sequence length on {device}, {setting} "
                     "(log-log; dotted: n, dashed: n²)")
            bad = sorted(set(d.loc[d["_untrusted"], "impl"].astype(str)))
            if bad:
                _title(fig, title + "; red ✕: not to be trusted")
                out.append(to_chart(fig, title + "; points not to be trusted (red crosses, "
                                    "left out of their lines): " + ", ".join(bad)))
                continue
            _title(fig, title)
            out.append(to_chart(fig, title))
    return out


def baseline_ratios(cmp: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                    ) -> List[Chart]:
    """Current / baseline median per point, by implementation (grouped by family), coloured
    by verdict."""
    if cmp.empty:
        return []
    styles = styles or impl_styles(cmp)
    present = set(cmp["impl"])
    names = [i for i in ordered(styles) if i in present]  # one column each, named on the axis
    palette = {"regression": "#c0392b", "improvement": "#1e8449", "within noise": "#95a5a6"}
    n = cmp["impl"].nunique()
    fig, ax = plt.subplots(figsize=(min(WIDTH_IN, 2.2 + 1.1 * n), 3.2))
    sns.stripplot(data=cmp, x="impl", y="ratio", hue="verdict", palette=palette, ax=ax,
                  order=names, jitter=0.25, size=5,
                  hue_order=[v for v in palette if v in set(cmp["verdict"])])
    ax.set_yscale("log")
    ax.axhline(1.0, color="0.3", lw=1)
    ax.set(xlabel="", ylabel="current / baseline median time",
           title="Against the baseline: above 1 is slower")
    ax.tick_params(axis="x", labelrotation=20 if n <= 8 else 50)
    if n > 8:
        plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    title = "current / baseline median time per point"
    return [Chart(to_data_uri(fig), title, [t.get_text() for t in ax.get_xticklabels()])]
