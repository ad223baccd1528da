"""Charts: seaborn on matplotlib's Agg backend, returned as inline PNG ``data:`` URIs.

Every function takes the measured points (status "ok") in long form and returns a
list of images, one per device, so a page with CPU and CUDA results shows both.
"""

from __future__ import annotations

import base64
import io
import itertools
import re
from typing import Any, Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")  # headless: never opens a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from reports.styles import Style, assign, families, ordered  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook", font_scale=0.8)
WIDTH_IN = 10.8  # at DPI this fits the page's 1100 px column with the legend
DPI = 100
PANEL_KEYS = ["dtype", "B", "D", "H"]  # shown in a panel title when they vary
DASHES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3))]  # per machine, mask...
LEGEND_COLUMNS = 7  # family columns under a chart; more families share columns


def impl_styles(*frames: pd.DataFrame) -> Dict[str, Style]:
    """One colour and marker per implementation named in ``frames`` (impl, framework)."""
    pairs = [(i, f) for df in frames if not df.empty
             for i, f in zip(df["impl"], df["framework"] if "framework" in df else
                             [None] * len(df))]
    return assign(families(pairs))


def to_data_uri(fig: plt.Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
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
    ax.annotate(label, (grid[-1], y0 * (grid[-1] / x0) ** power), fontsize=8, color="0.25",
                xytext=(2, 0), textcoords="offset points", va="center")


def _natural(value: Any) -> List[Any]:
    """A sort key that orders "H=8" before "H=16"."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p)
            for p in re.split(r"(\d+)", str(value))]


def _panels(d: pd.DataFrame, key: Optional[str]) -> List[Any]:
    """The values of ``key`` in natural order (one panel or dash pattern each)."""
    return sorted(d[key].unique(), key=_natural) if key else [None]


def _lines(d: pd.DataFrame, x: str, y: str, row: Optional[str], col: Optional[str],
           dash: Optional[str], ylabel: str, xlabel: str, styles: Dict[str, Style],
           logy: bool = True, guides: Optional[Dict[float, str]] = None,
           col_template: str = "{col_name}") -> plt.Figure:
    """One line per (implementation, ``dash`` value) over log2 x, one panel per (row, col).

    Colour is the implementation's family, the marker the implementation within it (both
    from ``styles``, the report's one assignment), the dash pattern the ``dash`` column's
    value (machine, mask, gradients); guides as {power: label}.
    """
    rows, cols = _panels(d, row), _panels(d, col)
    height = 2.5 if len(rows) > 1 else 3.0
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(WIDTH_IN, height * len(rows)),
                             sharex=True, squeeze=False)
    dashes = {v: DASHES[i % len(DASHES)] for i, v in enumerate(_panels(d, dash))}
    for (i, r), (j, c) in itertools.product(enumerate(rows), enumerate(cols)):
        ax = axes[i][j]
        sub = d
        if row:
            sub = sub[sub[row] == r]
        if col:
            sub = sub[sub[col] == c]
        sub = sub[np.isfinite(sub[y]) & (sub[y] > 0 if logy else True)]
        for (impl, dv), g in sub.groupby(["impl", dash] if dash else ["impl", "impl"],
                                         sort=False):
            st = styles[impl]
            line = g.groupby(x)[y].mean().sort_index()  # (n,) one value per x
            ax.plot(line.index.to_numpy(float), line.to_numpy(float), color=st.colour,
                    marker=st.marker, markersize=5, lw=1.2,
                    markerfacecolor=st.colour if st.filled else "white",
                    linestyle=dashes[dv] if dash else "-", gid=impl)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        for power, label in (guides or {}).items():
            _guide(ax, sub[x].to_numpy(float), sub[y].to_numpy(float), power, label,
                   "--" if power >= 2 else ":")
        title = [col_template.format(col_name=c)] if col else []
        title += [str(r)] if row else []
        ax.set_title(" · ".join(title), fontsize=9)
        ax.set_xlabel(xlabel if i == len(rows) - 1 else "")
        ax.set_ylabel(ylabel if j == 0 else "")
    fig.tight_layout(h_pad=1.0, w_pad=1.0)
    _legends(fig, [i for i in ordered(styles) if i in set(d["impl"])], styles,
             {str(v): dashes[v] for v in _panels(d, dash)} if dash else {}, dash)
    return fig


def _legends(fig: plt.Figure, impls: List[str], styles: Dict[str, Style],
             dashes: Dict[str, Any], dash_name: Optional[str]) -> None:
    """One legend under the panels: a column per family, its name (bold) on top and its
    implementations below, then a column for the dash patterns (the varying dimension's
    name in italics on top) when one varies."""
    groups: Dict[str, List[str]] = {}
    for impl in impls:
        groups.setdefault(styles[impl].family, []).append(impl)
    blank = Line2D([], [], linestyle="none")
    columns = []
    for fam, members in groups.items():
        handles = [(blank, fam)] + [
            (Line2D([], [], color=styles[m].colour, marker=styles[m].marker, markersize=5,
                    markerfacecolor=styles[m].colour if styles[m].filled else "white", lw=1.2),
             m) for m in members]
        columns.append(handles)
    dash_header = Line2D([], [], linestyle="none")
    if dashes:
        columns.append([(dash_header, dash_name)] + [
            (Line2D([], [], color="0.3", lw=1.2, linestyle=ls), str(v))
            for v, ls in dashes.items()])
    packed = _pack(columns)
    depth = max(len(c) for c in packed)
    entries = [e for c in packed for e in c + [(None, "")] * (depth - len(c))]
    entries = [(blank if h is None else h, t) for h, t in entries]
    ncol = len(packed)
    leg = fig.legend([h for h, _ in entries], [t for _, t in entries], loc="upper left",
                     bbox_to_anchor=(0.0, 0.0), ncol=ncol, frameon=False, fontsize=8,
                     handlelength=2.6, columnspacing=1.2, borderaxespad=0.0)
    for (handle, label), text in zip(entries, leg.get_texts()):
        if handle is blank and label:  # a family's name heads its members
            text.set_fontweight("bold")
        elif handle is dash_header:
            text.set_fontstyle("italic")


def _pack(groups: List[List[Any]]) -> List[List[Any]]:
    """Groups of legend entries, in order, into at most ``LEGEND_COLUMNS`` columns of one
    depth, a group never split between columns unless it is deeper than the column."""
    depth = max(max(len(g) for g in groups),
                -(-sum(len(g) for g in groups) // LEGEND_COLUMNS))
    while True:
        columns: List[List[Any]] = [[]]
        for g in groups:
            if columns[-1] and len(columns[-1]) + len(g) > depth:
                columns.append([])
            columns[-1].extend(g)
        if len(columns) <= LEGEND_COLUMNS:
            return columns
        depth += 1


def _title(fig: plt.Figure, text: str) -> None:
    fig.suptitle(text, y=1.0, x=0.01, ha="left", va="bottom", fontsize=11)


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


def time_vs_length(ok: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                   ) -> List[str]:
    """Log-log median time vs length with an n^2 guide: rows = head count, columns = mask."""
    styles = styles or impl_styles(ok)
    out = []
    for device, d in length_subset(ok).groupby("device"):
        d = d.assign(time_ms=d["median_s"] * 1e3, panel=panel_label(d, PANEL_KEYS, ["H"]))
        d, style = with_style(d, ["machine", "grad"])
        fig = _lines(d, "L", "time_ms", "panel", "mask", style, "median time per call (ms)",
                     "sequence length L (= S)", styles,
                     guides={2.0: "n²"}, col_template="mask: {col_name}")
        _title(fig, f"Time vs sequence length on {device} (log-log; dashed: n²)")
        out.append(to_data_uri(fig))
    return out


def time_vs_heads(ok: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                  ) -> List[str]:
    """Log-log median time vs head count at a fixed length, with a linear guide."""
    styles = styles or impl_styles(ok)
    out = []
    for device, d in heads_subset(ok).groupby("device"):
        d = d.assign(time_ms=d["median_s"] * 1e3,
                     panel=panel_label(d, ["dtype", "B", "D", "L"], ["L"]))
        d, style = with_style(d, ["machine", "grad"])
        fig = _lines(d, "H", "time_ms", "panel", "mask", style, "median time per call (ms)",
                     "head count H (E = H·D)", styles,
                     guides={1.0: "∝ H"}, col_template="mask: {col_name}")
        _title(fig, f"Time vs head count on {device} (log-log; dotted: linear in H)")
        out.append(to_data_uri(fig))
    return out


def throughput(ok: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
               ) -> List[str]:
    """GFLOP/s and share of the measured matmul peak vs length."""
    styles = styles or impl_styles(ok)
    out = []
    for device, d in length_subset(ok).groupby("device"):
        d, style = with_style(d.assign(panel=panel_label(d, PANEL_KEYS, ["H"])),
                              ["machine", "mask", "grad"])
        long = pd.concat([
            d.assign(metric="achieved GFLOP/s", value=d["flops_per_s"] / 1e9),
            d.assign(metric="% of measured matmul peak", value=100 * d["peak_share"])])
        long = long[np.isfinite(long["value"])]
        fig = _lines(long, "L", "value", "panel", "metric", style, "", "sequence length L",
                     styles, logy=False)
        for ax in fig.axes:
            ax.set_ylim(bottom=0)
        _title(fig, f"Throughput on {device}: FLOP/s and share of the matmul peak")
        out.append(to_data_uri(fig))
    return out


def memory_vs_length(ok: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                     ) -> List[str]:
    """Log-log peak memory vs length, with linear and quadratic guides."""
    styles = styles or impl_styles(ok)
    out = []
    measured = ok[(ok["peak_bytes"] > 0) & ok["peak_method"].ne("not measured")]
    for device, d in length_subset(measured).groupby("device"):
        d = d.assign(peak_mib=d["peak_bytes"] / 2**20, panel=panel_label(d, PANEL_KEYS, ["H"]))
        d, style = with_style(d, ["machine", "mask", "grad"])
        fig = _lines(d, "L", "peak_mib", "panel" if d["panel"].nunique() > 1 else None, None,
                     style, "peak memory (MiB)", "sequence length L", styles,
                     guides={1.0: "n", 2.0: "n²"})
        _title(fig, f"Peak memory vs sequence length on {device} (log-log; dotted: n, dashed: n²)")
        out.append(to_data_uri(fig))
    return out


def baseline_ratios(cmp: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                    ) -> List[str]:
    """Current / baseline median per point, by implementation (grouped by family), coloured
    by verdict."""
    if cmp.empty:
        return []
    styles = styles or impl_styles(cmp)
    present = set(cmp["impl"])
    palette = {"regression": "#c0392b", "improvement": "#1e8449", "within noise": "#95a5a6"}
    n = cmp["impl"].nunique()
    fig, ax = plt.subplots(figsize=(min(WIDTH_IN, 2.2 + 1.1 * n), 3.2))
    sns.stripplot(data=cmp, x="impl", y="ratio", hue="verdict", palette=palette, ax=ax,
                  order=[i for i in ordered(styles) if i in present], jitter=0.25, size=5,
                  hue_order=[v for v in palette if v in set(cmp["verdict"])])
    ax.set_yscale("log")
    ax.axhline(1.0, color="0.3", lw=1)
    ax.set(xlabel="", ylabel="current / baseline median time",
           title="Against the baseline: above 1 is slower")
    ax.tick_params(axis="x", labelrotation=20 if n <= 8 else 50)
    if n > 8:
        plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return [to_data_uri(fig)]
