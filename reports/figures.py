"""Charts: seaborn on matplotlib's Agg backend, returned as inline PNG ``data:`` URIs.

Every function takes the measured points (status "ok") in long form and returns a
list of images, one per device, so a page with CPU and CUDA results shows both.
"""

from __future__ import annotations

import base64
import io
from typing import Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")  # headless: never opens a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook", font_scale=0.8)
WIDTH_IN = 10.8  # at DPI this fits the page's 1100 px column with the legend
DPI = 100
PANEL_KEYS = ["dtype", "B", "D", "H"]  # shown in a panel title when they vary


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


def _relplot(d: pd.DataFrame, x: str, y: str, row: Optional[str], col: Optional[str],
             style: Optional[str], ylabel: str, xlabel: str, logy: bool = True,
             guides: Optional[Dict[float, str]] = None, hue: str = "impl",
             col_template: str = "{col_name}") -> sns.FacetGrid:
    """Lines per ``hue`` over log2 x, one panel per (row, col); guides as {power: label}."""
    ncol = d[col].nunique() if col else 1
    nrow = d[row].nunique() if row else 1
    height = 2.7 if nrow > 1 else 3.2
    aspect = (WIDTH_IN - 2.2) / ncol / height  # leave room for the legend on the right
    marks = {"markers": True, "dashes": True} if style else {"marker": "o"}
    g = sns.relplot(data=d, x=x, y=y, hue=hue, style=style, row=row, col=col, kind="line",
                    height=height, aspect=aspect, errorbar=None, markersize=4, **marks,
                    facet_kws={"sharey": False, "sharex": True, "margin_titles": True},
                    hue_order=sorted(d[hue].unique()))
    for key, ax in (g.axes_dict.items() or [(None, g.ax)]):
        r, c = key if (row and col) else ((key, None) if row else (None, key))
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        sub = d
        if row:
            sub = sub[sub[row] == r]
        if col:
            sub = sub[sub[col] == c]
        sub = sub[np.isfinite(sub[y]) & (sub[y] > 0)]
        for power, label in (guides or {}).items():
            _guide(ax, sub[x].to_numpy(float), sub[y].to_numpy(float), power, label,
                   "--" if power >= 2 else ":")
    g.set_axis_labels(xlabel, ylabel)
    g.set_titles(row_template="{row_name}", col_template=col_template)
    if g.legend is not None:
        sns.move_legend(g, "upper left", bbox_to_anchor=(0.985, 0.95), frameon=False,
                        title=None)
    return g


def _title(g: sns.FacetGrid, text: str) -> None:
    g.figure.suptitle(text, y=1.0, x=0.02, ha="left", fontsize=11)
    g.figure.subplots_adjust(top=0.86 if len(g.axes) == 1 else 0.92)


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


def time_vs_length(ok: pd.DataFrame) -> List[str]:
    """Log-log median time vs length with an n^2 guide: rows = head count, columns = mask."""
    out = []
    for device, d in length_subset(ok).groupby("device"):
        d = d.assign(time_ms=d["median_s"] * 1e3, panel=panel_label(d, PANEL_KEYS, ["H"]))
        d, style = with_style(d, ["machine", "grad"])
        g = _relplot(d, "L", "time_ms", "panel", "mask", style, "median time per call (ms)",
                     "sequence length L (= S)",
                     guides={2.0: "n²"}, col_template="mask: {col_name}")
        _title(g, f"Time vs sequence length on {device} (log-log; dashed: n²)")
        out.append(to_data_uri(g.figure))
    return out


def time_vs_heads(ok: pd.DataFrame) -> List[str]:
    """Log-log median time vs head count at a fixed length, with a linear guide."""
    out = []
    for device, d in heads_subset(ok).groupby("device"):
        d = d.assign(time_ms=d["median_s"] * 1e3,
                     panel=panel_label(d, ["dtype", "B", "D", "L"], ["L"]))
        d, style = with_style(d, ["machine", "grad"])
        g = _relplot(d, "H", "time_ms", "panel", "mask", style, "median time per call (ms)",
                     "head count H (E = H·D)",
                     guides={1.0: "∝ H"}, col_template="mask: {col_name}")
        _title(g, f"Time vs head count on {device} (log-log; dotted: linear in H)")
        out.append(to_data_uri(g.figure))
    return out


def throughput(ok: pd.DataFrame) -> List[str]:
    """GFLOP/s and share of the measured matmul peak vs length."""
    out = []
    for device, d in length_subset(ok).groupby("device"):
        d, style = with_style(d.assign(panel=panel_label(d, PANEL_KEYS, ["H"])),
                              ["machine", "mask", "grad"])
        long = pd.concat([
            d.assign(metric="achieved GFLOP/s", value=d["flops_per_s"] / 1e9),
            d.assign(metric="% of measured matmul peak", value=100 * d["peak_share"])])
        long = long[np.isfinite(long["value"])]
        g = _relplot(long, "L", "value", "panel", "metric", style, "", "sequence length L",
                     logy=False)
        for ax in g.axes.flat:
            ax.set_ylim(bottom=0)
        _title(g, f"Throughput on {device}: FLOP/s and share of the matmul peak")
        out.append(to_data_uri(g.figure))
    return out


def memory_vs_length(ok: pd.DataFrame) -> List[str]:
    """Log-log peak memory vs length, with linear and quadratic guides."""
    out = []
    measured = ok[(ok["peak_bytes"] > 0) & ok["peak_method"].ne("not measured")]
    for device, d in length_subset(measured).groupby("device"):
        d = d.assign(peak_mib=d["peak_bytes"] / 2**20, panel=panel_label(d, PANEL_KEYS, ["H"]))
        d, style = with_style(d, ["machine", "mask", "grad"])
        g = _relplot(d, "L", "peak_mib", "panel" if d["panel"].nunique() > 1 else None, None,
                     style, "peak memory (MiB)",
                     "sequence length L", guides={1.0: "n", 2.0: "n²"})
        _title(g, f"Peak memory vs sequence length on {device} (log-log; dotted: n, dashed: n²)")
        out.append(to_data_uri(g.figure))
    return out


def baseline_ratios(cmp: pd.DataFrame) -> List[str]:
    """Current / baseline median per point, by implementation, coloured by verdict."""
    if cmp.empty:
        return []
    palette = {"regression": "#c0392b", "improvement": "#1e8449", "within noise": "#95a5a6"}
    n = cmp["impl"].nunique()
    fig, ax = plt.subplots(figsize=(min(WIDTH_IN, 2.2 + 1.1 * n), 3.2))
    sns.stripplot(data=cmp, x="impl", y="ratio", hue="verdict", palette=palette, ax=ax,
                  order=sorted(cmp["impl"].unique()), jitter=0.25, size=5,
                  hue_order=[v for v in palette if v in set(cmp["verdict"])])
    ax.set_yscale("log")
    ax.axhline(1.0, color="0.3", lw=1)
    ax.set(xlabel="", ylabel="current / baseline median time",
           title="Against the baseline: above 1 is slower")
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return [to_data_uri(fig)]
