"""Charts (seaborn on matplotlib's Agg backend) as inline PNG data URIs."""

from __future__ import annotations

import base64
import io
from typing import List, Optional

import matplotlib

matplotlib.use("Agg")  # headless: never opens a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook", font_scale=0.85)
WIDTH_IN = 10.5  # fits the page's 1100 px column at 100 dpi


def to_data_uri(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _style(df: pd.DataFrame) -> Optional[str]:
    """Machines as line style when results come from several."""
    return "machine" if df["machine"].nunique() > 1 else None


def _facet(df: pd.DataFrame, x: str, y: str, col: str, row: Optional[str], logx: bool,
           logy: bool, ylabel: str, guide: Optional[float] = None):
    height = 3.0
    ncols = max(1, df[col].nunique())
    g = sns.relplot(data=df, x=x, y=y, hue="impl", style=_style(df), col=col, row=row,
                    kind="line", marker="o", height=height,
                    aspect=min(1.6, WIDTH_IN / height / ncols), facet_kws={"sharey": False},
                    errorbar=None)
    for ax in g.axes.flat:
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
    if guide is not None:
        _guides(g, df, x, y, col, row, guide)
    return g


def _guides(g, df, x, y, col, row, power: float) -> None:
    """A dashed L^power line through each panel's geometric-mean point."""
    for (row_val, col_val), ax in g.axes_dict.items() if row else (
            ((None, k), v) for k, v in g.axes_dict.items()):
        sub = df[df[col] == col_val]
        if row:
            sub = sub[sub[row] == row_val]
        if sub.empty:
            continue
        xs = np.sort(sub[x].unique()).astype(float)
        anchor_x = float(np.exp(np.log(xs).mean()))
        anchor_y = float(np.exp(np.log(sub[y].astype(float)).mean()))
        ax.plot(xs, anchor_y * (xs / anchor_x) ** power, "k--", lw=1, alpha=0.5,
                label=f"n^{power:g} guide")
        ax.text(xs[-1], anchor_y * (xs[-1] / anchor_x) ** power, f" n^{power:g}", fontsize=8,
                va="bottom", ha="right", alpha=0.7)


def _scaling_subset(ok: pd.DataFrame) -> pd.DataFrame:
    """Points of head counts with at least three lengths (the length sweep)."""
    counts = ok.groupby(["device", "H"])["Lq"].nunique()
    keep = counts[counts >= 3].index
    return ok.set_index(["device", "H"]).loc[lambda d: d.index.isin(keep)].reset_index()


def time_vs_length(ok: pd.DataFrame) -> List[str]:
    """log-log time vs length, per device: columns = mask, rows = head count."""
    out = []
    sub = _scaling_subset(ok)
    for device, d in sub.groupby("device"):
        d = d.assign(time_ms=d["median_s"] * 1e3)
        g = _facet(d, "Lq", "time_ms", "mask", "H" if d["H"].nunique() > 1 else None,
                   True, True, "median time (ms)", guide=2.0)
        g.figure.suptitle(f"time vs sequence length ({device}); dashed: n^2", y=1.02)
        out.append(to_data_uri(g.figure))
    return out


def time_vs_heads(ok: pd.DataFrame) -> List[str]:
    out = []
    counts = ok.groupby(["device", "Lq"])["H"].nunique()
    for (device, L), n in counts.items():
        if n < 3:
            continue
        d = ok[(ok["device"] == device) & (ok["Lq"] == L)]
        d = d.assign(time_ms=d["median_s"] * 1e3)
        g = _facet(d, "H", "time_ms", "mask", None, True, True, "median time (ms)", guide=1.0)
        g.figure.suptitle(f"time vs head count ({device}, L = {L}); dashed: linear", y=1.02)
        out.append(to_data_uri(g.figure))
    return out


def throughput(ok: pd.DataFrame) -> List[str]:
    out = []
    sub = _scaling_subset(ok)
    for device, d in sub.groupby("device"):
        d = d.assign(gflops=d["flops_per_s"] / 1e9, share=100 * d["peak_share"])
        fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.4))
        sns.lineplot(data=d, x="Lq", y="gflops", hue="impl", style="mask", marker="o",
                     ax=axes[0], errorbar=None)
        axes[0].set(xscale="log", ylabel="GFLOP/s", title=f"achieved throughput ({device})")
        axes[0].set_xscale("log", base=2)
        if d["share"].notna().any():
            sns.lineplot(data=d, x="Lq", y="share", hue="impl", style="mask", marker="o",
                         ax=axes[1], errorbar=None, legend=False)
            axes[1].set_xscale("log", base=2)
            axes[1].set(ylabel="% of measured matmul peak", title="share of the matmul peak")
        else:
            axes[1].set_axis_off()
        axes[0].legend(fontsize=7, ncols=2)
        out.append(to_data_uri(fig))
    return out


def memory_vs_length(ok: pd.DataFrame) -> List[str]:
    out = []
    sub = _scaling_subset(ok.dropna(subset=["peak_bytes"]))
    sub = sub[sub["peak_bytes"] > 0]
    for device, d in sub.groupby("device"):
        d = d.assign(peak_mib=d["peak_bytes"] / 2**20)
        d = d.assign(impl_method=d["impl"] + " (" + d["peak_method"].astype(str) + ")")
        fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.6))
        sns.lineplot(data=d, x="Lq", y="peak_mib", hue="impl_method", style="mask", marker="o",
                     ax=ax, errorbar=None)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        xs = np.sort(d["Lq"].unique()).astype(float)
        y0 = float(d["peak_mib"].median())
        mid = float(np.exp(np.log(xs).mean()))
        ax.plot(xs, y0 * (xs / mid), "k:", lw=1, alpha=0.5, label="linear guide")
        ax.plot(xs, y0 * (xs / mid) ** 2, "k--", lw=1, alpha=0.5, label="quadratic guide")
        ax.set(ylabel="peak memory (MiB)", title=f"peak memory vs sequence length ({device})")
        ax.legend(fontsize=7, ncols=2, loc="upper left")
        out.append(to_data_uri(fig))
    return out
