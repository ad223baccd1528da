"""The report builds from committed fixtures, partial ones included, and is self-contained."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest
from bs4 import BeautifulSoup
from matplotlib.text import Text

from reports import figures
from reports.build import build_report
from reports.frames import load, load_sweeps
from reports.styles import COLOURS, KNOWN_FAMILIES, MARKERS, assign, family_of, family_order
from reports.tables import OUTCOME_ORDER as OUTCOME_NAMES
from reports.tables import compare_baseline

FIXTURES = Path(__file__).parent / "fixtures"
# Twenty-two implementations as the built-ins and a user's plugins name them: (name, framework)
TWENTY = [("numpy", "numpy"), ("numpy.flash", "numpy"), ("torch.eager", "torch"),
          ("torch.sdpa", "torch"), ("torch.sdpa[flash]", "torch"), ("torch.F_mha", "torch"),
          ("torch.F_mha+weights", "torch"), ("jax.jit", "jax"), ("jax.nn", "jax"),
          ("keras.mha[torch]", "torch"), ("keras.mha[torch]+weights", "torch"),
          ("keras.mha[jax]", "jax"), ("flax.mha", "jax"), ("flax.mha+weights", "jax"),
          ("hf.bert.eager", "torch"), ("hf.bert.sdpa", "torch"), ("hf.gpt2.eager", "torch"),
          ("hf.gpt2.sdpa", "torch"), ("hf.llama.eager", "torch"), ("hf.llama.sdpa", "torch"),
          ("mymha", "torch"), ("acme.fused", "jax")]
FAMILY = {"numpy": "numpy", "numpy.flash": "numpy", "mymha": "torch", "acme.fused": "acme",
          **{n: n.split(".")[0] for n, _ in TWENTY if n.split(".")[0] in KNOWN_FAMILIES}}
DTYPES = ["float32", "float16", "bfloat16", "float64"]


def synthetic_results(out: Path) -> Path:
    """A sweep and a conformance file for the ``TWENTY`` implementations in ``out``.

    Built from committed runs: numpy's measured points (five lengths, five head counts)
    copied per implementation with times scaled and bent so that lines cross, and the
    real conformance cases in four dtypes with some failures and deviations planted.
    """
    out.mkdir(parents=True, exist_ok=True)
    sweep = json.loads((FIXTURES / "vm" / "sweep_vm.json").read_text())
    template = [b for b in sweep["benchmarks"] if b["extra_info"]["impl"] == "numpy"]
    sweep["benchmarks"], sweep["mha_suite_not_measured"] = [], []
    for i, (name, framework) in enumerate(TWENTY):
        for b in template:
            b = json.loads(json.dumps(b))
            x = b["extra_info"]
            x.update(impl=name, framework=framework)
            scale = 0.4 * 1.09 ** i * (x["Lq"] / 512) ** (0.06 * (i % 5 - 2))
            if name == "keras.mha[torch]+weights" and x["Lq"] >= 512:  # long names win
                scale *= 0.1
            if name == "hf.llama.sdpa" and x["Lq"] <= 256:
                scale *= 0.05
            for k in ("min", "max", "mean", "median", "q1", "q3", "iqr", "stddev"):
                b["stats"][k] *= scale
            x["flops_per_s"] = x["flops"] / b["stats"]["median"]
            x["peak_bytes"] = int(2**20 * (1 + i) * (x["Lq"] / 128) ** (1 + (i % 2)))
            x["peak_method"] = "rss_hwm_delta"
            b["name"] = b["name"].replace("numpy-", f"{name}-", 1)
            b["fullname"] = b["fullname"].replace("numpy-", f"{name}-", 1)
            sweep["benchmarks"].append(b)
    (out / "sweep-20.json").write_text(json.dumps(sweep))

    conf = json.loads((FIXTURES / "real" / "conformance.json").read_text())
    entry = next(i for i in conf["implementations"] if i["name"] == "numpy")
    cases = [r for r in conf["results"] if r["impl"] == "numpy"]
    conf["implementations"], conf["results"] = [], []
    for i, (name, framework) in enumerate(TWENTY):
        builtin = FAMILY[name] in KNOWN_FAMILIES
        conf["implementations"].append({**entry, "name": name, "framework": framework,
                                        "source": "builtin" if builtin else f"plugin {name}.py",
                                        "dtypes": {"cpu": DTYPES}})
        for j, (dtype, r) in enumerate((d, r) for d in DTYPES for r in cases):
            r = {**r, "impl": name, "dtype": dtype,
                 "test_id": r["test_id"].replace("numpy-cpu-float32", f"{name}-cpu-{dtype}")}
            if r["outcome"] == "pass" and (i + j) % 37 == 0:
                r.update(outcome="fail", reason="planted: err above the bound")
            elif r["outcome"] == "pass" and (i * j) % 53 == 7:
                r.update(outcome="deviation", reason="planted: fully masked rows -> NaN")
            conf["results"].append(r)
    (out / "conformance-20.json").write_text(json.dumps(conf))
    return out
CHART_SECTIONS = ["scaling", "heads", "throughput", "memory"]
SECTIONS = ["environment", "conformance", *CHART_SECTIONS, "ranking", "not-measured"]


def _soup(path: Path) -> BeautifulSoup:
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _images(soup: BeautifulSoup, section: str) -> int:
    return len(soup.find(id=section).find_all(["img", "svg"]))


def _assert_self_contained(soup: BeautifulSoup) -> None:
    for tag in soup.find_all(src=True):
        assert tag["src"].startswith("data:image/"), tag["src"][:60]
    for tag in soup.find_all(href=True):
        assert tag["href"].startswith("#"), tag["href"]
    assert not soup.find_all("link")
    # one inline script (opening a linked <details>), nothing fetched, no network
    scripts = soup.find_all("script")
    assert len(scripts) <= 1 and not any(s.get("src") for s in scripts)
    assert not any(re.search(r"fetch\(|XMLHttpRequest|https?://|import\(", s.get_text())
                   for s in scripts)
    assert not re.search(r"url\(|@import|https?://", str(soup.find("style")))


def shared(tmp_path_factory, name: str, make) -> Path:
    """``make(folder)``'s path, made once per test run in a folder of its own and read by
    every test (of this module and of test_report_browser.py) and every xdist worker that
    asks for ``name``: the first to ask makes it under a lock, the others wait for it and
    read it (a report of twenty implementations is 10-20 s of drawing). Whoever reads it
    must not change it."""
    import os

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' folders share a parent
        root = root.parent
    folder = root / "shared" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    done = folder.with_suffix(".done")
    with FileLock(str(folder.with_suffix(".lock"))):
        if not done.exists():
            folder.mkdir(exist_ok=True)
            done.write_text(str(make(folder)))
    return Path(done.read_text())


def full_report(tmp_path_factory) -> Path:
    """The report of the vm, gpu-box and laptop fixtures against the baseline fixture."""
    return shared(tmp_path_factory, "full", lambda folder: build_report(
        [FIXTURES / "vm", FIXTURES / "gpu", FIXTURES / "partial"], folder / "report.html",
        baseline_paths=[FIXTURES / "baseline"]))


def twenty_results(tmp_path_factory) -> Path:
    """``synthetic_results``, written once."""
    return shared(tmp_path_factory, "twenty", synthetic_results)


def twenty_report_path(tmp_path_factory) -> Path:
    """The report of ``synthetic_results`` (twenty implementations)."""
    results = twenty_results(tmp_path_factory)
    return shared(tmp_path_factory, "twenty-report",
                  lambda folder: build_report([results], folder / "report.html"))


def _unencoded(monkeypatch) -> None:
    """Charts drawn in full but not encoded as PNG (each chart's ``uri`` empty), for a test
    that reads no image of the page: a chart's labels, title and note come from the drawn
    figure, and the encoding (about half of a chart's time) is checked by the tests that
    read the images (``full``, the twenty implementations' report, the browser tests)."""
    import matplotlib.pyplot as plt

    monkeypatch.setattr(figures, "to_data_uri", lambda fig, tight=True: plt.close(fig) or "")


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> BeautifulSoup:
    return _soup(full_report(tmp_path_factory))


def test_every_section_with_its_charts(full):
    for section in SECTIONS + ["baseline"]:
        assert full.find("section", id=section) is not None, section
    # a chart per device and head count: cpu at H=8 (vm, laptop) and H=16 (gpu-box), cuda
    assert _images(full, "scaling") == 3
    assert _images(full, "throughput") == 3
    assert _images(full, "memory") == 3
    assert _images(full, "heads") == 1  # only the vm swept head counts
    assert _images(full, "baseline") == 1
    _assert_self_contained(full)


def test_environment_lists_every_machine(full):
    text = full.find(id="environment").get_text(" ")
    for fact in ("vm", "gpu-box", "laptop", "NVIDIA A100-SXM4-40GB", "AMD Ryzen 7 7840U",
                 "torch 2.13.0+cu128", "openblas", "c3c7616a32b2"):
        assert fact in text, fact


def test_conformance_matrix_shows_every_outcome(full):
    sec = full.find(id="conformance")
    matrix = sec.find("table")
    rows = {td.get_text(strip=True): td.parent for td in matrix.find_all("td", class_="impl")}
    assert set(rows) == {"bug.ignores_mask", "jax.nn", "numpy", "torch.nn"}
    assert rows["bug.ignores_mask"].find("td", class_="fail") is not None
    assert rows["torch.nn"].find("td", class_="deviation") is not None
    assert rows["numpy"].find("td", class_="fail") is None
    details = sec.find_all("details", id=True)
    assert len(details) == 4  # one expandable case list per implementation
    # ...inside one closed list below the matrix, each opened from its name in the matrix
    (outer,) = sec.find_all("details", class_="per-impl")
    assert not outer.has_attr("open") and all(d in outer.descendants for d in details)
    links = {a["href"] for a in matrix.find_all("a")}
    assert links == {"#" + d["id"] for d in details}
    bug = next(d for d in details if "bug.ignores_mask" in d.summary.get_text())
    assert "×bound" in bug.get_text() and "IndexError" in bug.get_text()
    assert "NaN + -inf is NaN" in sec.get_text()  # torch.nn's declared reason
    assert "needs a CUDA device" in sec.get_text()  # an unavailable implementation


def test_exponents_ranking_and_not_measured(full):
    exps = full.find(id="scaling").find("table").get_text(" ")
    assert re.search(r"\d\.\d\d \[-?\d\.\d\d, \d\.\d\d\] · L² \d+% · off \d+% at \d+", exps)
    ranking = " ".join(full.find(id="ranking").get_text(" ").split())
    assert "speed-up over numpy" in ranking and "torch.sdpa" in ranking
    nm = full.find(id="not-measured").get_text(" ")
    assert "No measured point at all: torch.flex" in " ".join(nm.split())
    for reason in ("CUDA out of memory", "exceeds the memory budget", "flex_attention"):
        assert reason in nm


def test_baseline_flags_the_planted_changes(full):
    sec = full.find(id="baseline")
    verdicts = {}
    for tr in sec.find_all("tr")[1:]:
        cells = [td.get_text(strip=True) for td in tr.find_all("td")]
        verdicts.setdefault(cells[0], set()).add(cells[-1])
    # the fixtures' baseline had torch.sdpa faster (regression now), jax.jit slower
    assert "regression" in verdicts["torch.sdpa"]
    assert "improvement" in verdicts["jax.jit"]
    assert "improvement" not in verdicts["torch.sdpa"]
    assert "regression" not in verdicts["jax.jit"]


def test_baseline_verdicts_follow_the_spread(tmp_path):
    doc = json.loads((FIXTURES / "real" / "sweep-a.json").read_text())
    slow = json.loads(json.dumps(doc))
    for b in slow["benchmarks"]:
        s = b["stats"]
        if b["extra_info"]["impl"] == "numpy":
            for k in ("min", "max", "mean", "median", "q1", "q3"):
                s[k] *= 50  # beyond any spread, even a real point with q3 = 21 q1
        else:  # a shift smaller than the spread: the interquartile ranges still overlap
            shift = 0.4 * (s["q3"] - s["q1"])
            for k in ("median", "q1", "q3"):
                s[k] += shift
    (tmp_path / "base.json").write_text(json.dumps(doc))
    (tmp_path / "cur.json").write_text(json.dumps(slow))
    cur = load_sweeps([tmp_path / "cur.json"])
    cmp = compare_baseline(cur, load_sweeps([tmp_path / "base.json"]))
    assert len(cmp) == len(doc["benchmarks"])
    assert set(cmp[cmp["impl"] == "numpy"]["verdict"]) == {"regression"}
    assert set(cmp[cmp["impl"] != "numpy"]["verdict"]) == {"within noise"}
    assert (cmp[cmp["impl"] != "numpy"]["ratio"] > 1).all()  # slower, yet not flagged


def test_partial_results_and_an_implementation_that_failed_everywhere(tmp_path):
    out = build_report([FIXTURES / "partial"], tmp_path / "r.html")
    soup = _soup(out)
    for section in SECTIONS:
        assert soup.find("section", id=section) is not None, section
    assert _images(soup, "scaling") == 1 and _images(soup, "heads") == 0
    assert "flex_attention on CPU" in soup.find(id="not-measured").get_text()
    assert "No conformance results" in soup.find(id="conformance").get_text()
    _assert_self_contained(soup)


def test_conformance_only_and_real_runs(tmp_path):
    soup = _soup(build_report([FIXTURES / "vm" / "conformance_vm.json"], tmp_path / "c.html"))
    assert _images(soup, "scaling") == 0 and "No length sweep" in soup.get_text()
    assert soup.find(id="conformance").find("td", class_="fail") is not None
    soup = _soup(build_report([FIXTURES / "real"], tmp_path / "r.html"))
    assert _images(soup, "scaling") == 1 and _images(soup, "heads") == 1
    _assert_self_contained(soup)


def test_several_machines_are_a_dimension(full):
    exps = full.find(id="scaling").find("table")
    machines = {tr.find("td").get_text(strip=True) for tr in exps.find_all("tr")[1:]}
    # laptop's sweep has three lengths: too few for the three-term cost model and an interval
    assert machines == {"vm", "gpu-box"}


def test_cli_writes_the_report_and_reports_errors(cli, tmp_path, capsys):
    from suite.cli import main

    out = tmp_path / "r.html"
    proc = cli("report", str(FIXTURES / "partial"), "--out", str(out),
               "--baseline-impl", "torch.sdpa")
    assert proc.returncode == 0, proc.stderr
    assert str(out.resolve()) in proc.stdout
    assert "speed-up over torch.sdpa" in " ".join(_soup(out).get_text().split())
    # the error in this process (the command's main, as the console script calls it): a
    # second process would spend its seconds importing pandas and seaborn to say it
    capsys.readouterr()
    returncode = main(["report", str(tmp_path / "nope")])
    stderr = capsys.readouterr().err
    assert returncode == 2
    assert "does not exist" in stderr and "Traceback" not in stderr


# --- twenty implementations ---------------------------------------------------------------
FAMILIES_IN_ORDER = ["numpy", "torch", "jax", "keras", "flax", "hf", "acme"]


@pytest.fixture(scope="module")
def twenty(tmp_path_factory) -> Path:
    return twenty_results(tmp_path_factory)


@pytest.fixture(scope="module")
def twenty_report(tmp_path_factory) -> BeautifulSoup:
    return _soup(twenty_report_path(tmp_path_factory))


def test_family_from_the_name_else_the_recorded_framework():
    assert family_of("hf.bert.sdpa", "torch") == "hf"
    assert family_of("keras.mha[jax]", "jax") == "keras"
    assert family_of("torch.sdpa[flash]", "torch") == "torch"
    assert family_of("mymha", "torch") == "torch"  # no dot: the framework it records
    assert family_of("mymha+weights", None) == "mymha"  # neither: the name itself
    assert family_of("numpy", float("nan")) == "numpy"
    assert family_order(["zeta", "hf", "acme", "numpy", "jax"]) == [
        "numpy", "jax", "hf", "acme", "zeta"]


def test_looks_stay_distinct_past_the_palette_and_the_markers():
    # one family with more members than markers, and more families than colours
    impls = {f"big.v{i:02d}": "big" for i in range(len(MARKERS) + 5)}
    impls.update({f"lib{k:02d}.a": f"lib{k:02d}" for k in range(len(COLOURS) + 3)})
    impls.update({f"lib{k:02d}.b": f"lib{k:02d}" for k in range(len(COLOURS) + 3)})
    styles = assign(impls)
    keys = [s.key for s in styles.values()]
    assert len(set(keys)) == len(keys)
    assert not styles[f"big.v{len(MARKERS):02d}"].filled  # the thirteenth: hollow
    assert assign(dict(reversed(list(impls.items())))) == styles  # order of discovery


def test_line_labels_spread_apart_in_order_and_stay_close():
    wanted = np.array([0.50, 0.51, 0.52, 0.9, 0.1, 0.505, 1.3])
    got = figures.spread(wanted, 0.05, 0.0, 1.0)
    order = np.argsort(wanted, kind="stable")
    assert np.all(np.diff(got[order]) >= 0.05 - 1e-12)  # no two closer than a line
    assert got.min() >= 0.0 and got.max() <= 1.0
    assert abs(got[4] - 0.1) < 1e-12  # a label with room stays level with its line
    # least squares: the crowded four centre on where they want to be
    assert abs(got[[0, 1, 2, 5]].mean() - wanted[[0, 1, 2, 5]].mean()) < 1e-9
    many = figures.spread(np.full(30, 0.5), 0.05, 0.0, 1.0)  # more than fit: centred
    assert np.allclose(np.sort(many), 0.5 + 0.05 * (np.arange(30) - 14.5))


def test_twenty_implementations_look_distinct_and_families_share_a_marker(twenty):
    sweeps, conformance = load([twenty])
    styles = figures.impl_styles(sweeps, conformance)
    assert set(styles) == {n for n, _ in TWENTY}
    assert {i: s.family for i, s in styles.items()} == FAMILY
    keys = [s.key for s in styles.values()]
    assert len(set(keys)) == len(keys), "two implementations drawn alike"
    marker, colours = {}, {}
    for s in styles.values():
        assert marker.setdefault(s.family, s.marker) == s.marker, s.family
        colours.setdefault(s.family, []).append(s.colour)
    assert len(set(marker.values())) == len(marker), "two families share a marker"
    for fam, cs in colours.items():  # a panel's lines differ in colour
        assert len(set(cs)) == len(cs), fam
    # the assignment does not depend on row order or on which file names an implementation
    shuffled = sweeps.sample(frac=1.0, random_state=3)
    assert figures.impl_styles(conformance, shuffled) == styles


def _label_boxes(fig):
    """Per axes: {implementation: its end label's box in pixels}."""
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        texts = [t for t in ax.texts if str(t.get_gid() or "").startswith(figures.LABEL_GID)]
        # the text's own box (an annotation's box spans its leader line too)
        out.append({t.get_text(): Text.get_window_extent(t) for t in texts})
    return out


def test_every_chart_draws_and_labels_an_implementation_alike(twenty, monkeypatch):
    sweeps, conformance = load([twenty])
    styles = figures.impl_styles(sweeps, conformance)
    ok = sweeps[sweeps["status"] == "ok"]
    drawn = []
    monkeypatch.setattr(figures, "to_data_uri", lambda fig, tight=True: drawn.append(fig) or "")
    few = ok[ok["impl"].isin(["hf.llama.sdpa", "jax.nn", "mymha"])]  # a chart with three
    charts = [*figures.time_vs_length(few, styles), *figures.time_vs_length(ok, styles),
              *figures.time_vs_heads(ok, styles), *figures.throughput(ok, styles),
              *figures.memory_vs_length(ok, styles)]
    assert len(drawn) == len(charts) == 5
    for fig, chart in zip(drawn, charts):
        seen = set()
        for ax, boxes in zip(fig.axes, _label_boxes(fig)):
            lines = {line.get_gid() for line in ax.get_lines()} - {None}  # None: a guide
            for line in ax.get_lines():
                impl = line.get_gid()
                if impl is None:
                    continue
                st = styles[impl]
                assert mcolors.to_hex(line.get_color()) == mcolors.to_hex(st.colour), impl
                assert line.get_marker() == st.marker, impl
                face = mcolors.to_hex(line.get_markerfacecolor())
                assert (face == mcolors.to_hex(st.colour)) == st.filled, impl
                title = next(t for t in ax.texts if t.get_gid() == figures.TITLE_GID)
                assert title.get_text().startswith(st.panel), impl  # its family's panel
            # every line of a panel is named once at its end, in the line's colour
            assert sorted(boxes) == sorted(lines), chart.title
            names = sorted(boxes)
            for k, a in enumerate(names):
                for b in names[k + 1:]:
                    assert not boxes[a].overlaps(boxes[b]), (chart.title, a, b)
            for t in ax.texts:
                if str(t.get_gid() or "").startswith(figures.LABEL_GID):
                    assert mcolors.to_hex(t.get_color()) == mcolors.to_hex(
                        styles[t.get_text()].colour)
            seen |= lines
        assert sorted(chart.labels) == sorted(seen)  # what the page's data-labels says
    assert set(charts[0].labels) == {"hf.llama.sdpa", "jax.nn", "mymha"}
    assert set(charts[1].labels) == {n for n, _ in TWENTY}


def test_matrix_grouped_by_family_in_a_stable_order(twenty_report):
    sec = twenty_report.find(id="conformance")
    groups = sec.find("table", class_="matrix").find_all("tbody", class_="group")
    assert [g["data-family"] for g in groups] == FAMILIES_IN_ORDER
    for g in groups:
        names = [td.get_text(strip=True) for td in g.find_all("td", class_="impl")]
        assert names == sorted(names)
        assert {FAMILY[n] for n in names} == {g["data-family"]}, names
        assert g.find("tr", class_="group").get_text(" ", strip=True).startswith(
            g["data-family"])
    assert sum(len(g.find_all("td", class_="impl")) for g in groups) == len(TWENTY)
    assert len(sec.find_all("details", id=True)) == len(TWENTY)
    cells = sec.find("table", class_="matrix").find_all("td", class_="fail")
    assert cells, "the planted failures show"


def test_ranking_lists_every_implementation_in_one_wrapping_column(twenty_report):
    table = twenty_report.find(id="ranking").find("table", class_="rank")
    header = [th.get_text(strip=True) for th in table.find_all("th")]
    assert header[-1] == "fastest first, speed-up over numpy"
    for tr in table.find_all("tr")[1:]:
        entries = tr.find_all("td")[-1].get_text().split("\u00a0· ")
        assert [e.split("\u00a0")[0] for e in entries] == [str(i) for i in
                                                           range(1, len(TWENTY) + 1)]
        assert sorted(e.split("\u00a0")[1] for e in entries) == sorted(n for n, _ in TWENTY)


# --- headline -----------------------------------------------------------------------------
def _headline(soup: BeautifulSoup) -> dict:
    sec = soup.find(id="headline")
    return {a.get_text(strip=True): a.find_parent("li").get_text(" ", strip=True)
            for a in sec.find("ul", class_="verdicts").find_all("a")}


def test_headline_says_what_each_implementation_did_and_links_it(full):
    lines = _headline(full)
    assert set(lines) == {"numpy", "torch.nn", "jax.nn", "bug.ignores_mask"}
    assert "conforms on the 40 cases it ran: 40 of 46 cases (87%) it was given, " \
        "6 unsupported" in lines["numpy"]
    assert "deviates as declared (fully_masked_rows, nan_padding) in 4 cases" in lines[
        "torch.nn"]
    assert lines["bug.ignores_mask"].startswith("bug.ignores_mask fails 18 cases: masking/")
    assert "+15 more" in lines["bug.ignores_mask"]  # three cases named, the rest counted
    assert "raises an error in 1 case" in lines["bug.ignores_mask"]
    sec = full.find(id="headline")
    classes = {a.get_text(strip=True): a["class"][0]
               for a in sec.find("ul", class_="verdicts").find_all("a")}
    assert classes == {"numpy": "pass", "torch.nn": "deviation", "jax.nn": "deviation",
                       "bug.ignores_mask": "fail"}
    # each item links to a place on the page: its conformance details, or the section
    for a in sec.find_all("a"):
        target = full.find(id=a["href"][1:])
        assert target is not None, a["href"]
    assert full.find(id=sec.find("a", string="torch.nn")["href"][1:]).summary.get_text(
        ).startswith("torch.nn:")
    groups = _outcome_groups(full)
    assert groups["fail"].startswith("✗ 1 fail bug.ignores_mask fails 18 cases")
    assert groups["deviation"] == "Δ 2 deviate as declared torch.nn, jax.nn"
    assert groups["pass"] == "✓ 1 conform numpy (40 of 46)"
    assert groups["unavailable"] == ("○ 1 not available here torch.sdpa[cudnn]: needs a CUDA "
                                     "device (torch.cuda.is_available() is False)")


def _outcome_groups(soup: BeautifulSoup) -> dict:
    """The headline's line per outcome: {outcome (or "unavailable"): its text}."""
    items = soup.find(id="headline").find("ul", class_="by-outcome").find_all("li",
                                                                             recursive=False)
    return {li.get("data-outcome") or li["class"][0]: " ".join(li.get_text(" ").split())
            .replace(" ,", ",").replace(" :", ":") for li in items}


def _conformance_doc(counts: dict, unavailable: dict = ()) -> dict:
    """The real conformance file with its results replaced: per implementation
    ({impl: {outcome: n}}) n cases of each outcome; ``unavailable``: {impl: its error}."""
    conf = json.loads((FIXTURES / "real" / "conformance.json").read_text())
    entry, case = conf["implementations"][0], conf["results"][0]
    conf["implementations"] = [{**entry, "name": n, "available": True} for n in counts] + [
        {**entry, "name": n, "available": False, "error": e} for n, e in dict(unavailable).items()]
    conf["results"] = [{**case, "impl": impl, "outcome": o, "case": f"{o}_{k}",
                        "test_id": f"{impl}-{o}-{k}", "reason": f"planted {o}"}
                       for impl, by in counts.items() for o, n in by.items() for k in range(n)]
    return conf


def test_headline_says_how_much_a_conforming_implementation_covered(tmp_path):
    # #42 item 9: "pallas.gpu.decode conforms (1 cases pass); 11 unsupported" said
    # "conforms" of an implementation that ran one case in twelve
    (tmp_path / "c.json").write_text(json.dumps(_conformance_doc({
        "numpy": {"pass": 12}, "few.cases": {"pass": 1, "unsupported": 11},
        "most.cases": {"pass": 9, "unsupported": 3}})))
    soup = _soup(build_report([tmp_path / "c.json"], tmp_path / "r.html"))
    lines, groups = _headline(soup), _outcome_groups(soup)
    assert "conforms (all 12 cases pass)" in lines["numpy"]
    assert "conforms on the 1 case it ran: 1 of 12 cases (8%) it was given, 11 unsupported" \
        in lines["few.cases"]
    assert "9 of 12 cases (75%) it was given, 3 unsupported" in lines["most.cases"]
    assert groups["pass"] == "✓ 2 conform numpy (all 12), most.cases (9 of 12)"
    assert groups["partial"] == ("◐ 1 pass where they run, but run under 50% of their cases "
                                 "few.cases (1 of 12)")
    sec = soup.find(id="headline")
    assert sec.find("ul", class_="verdicts").find("a", string="few.cases")["class"] == [
        "partial", "pill"]
    assert "1 conform" not in sec.get_text(" ") and "3 conform" not in sec.get_text(" ")


def test_headline_groups_by_outcome_and_says_unavailable_ones_in_one_line(tmp_path):
    # #42 item 9: 56 verdicts were 56 lines of tags, and each implementation not installed
    # a line of its own
    hint = "tensorflow is not installed (pip install tensorflow)"
    counts = {f"lib.k{i}": {"known_failure": 1, "pass": 3} for i in range(6)}
    counts.update({f"lib.d{i}": {"deviation": 2, "pass": 3} for i in range(6)})
    counts.update({"lib.bad": {"fail": 2, "pass": 3}, "lib.ok": {"pass": 4}})
    gone = {f"keras.mha[tf]{s}": hint for s in ("", "+weights")}
    gone["keras.mha[jax]"] = "run with KERAS_BACKEND=jax"
    (tmp_path / "c.json").write_text(json.dumps(_conformance_doc(counts, gone)))
    soup = _soup(build_report([tmp_path / "c.json"], tmp_path / "r.html"))
    groups = _outcome_groups(soup)
    assert list(groups) == ["fail", "known_failure", "deviation", "pass", "unavailable"]
    assert groups["fail"].startswith("✗ 1 fail lib.bad fails 2 cases: ")  # findings: cases
    assert groups["known_failure"] == "⚑ 6 with known failures " + ", ".join(
        f"lib.k{i}" for i in range(6))  # the rest: names, one line each outcome
    assert groups["unavailable"] == (
        f"○ 3 not available here keras.mha[jax]: run with KERAS_BACKEND=jax; "
        f"keras.mha[tf], keras.mha[tf]+weights: {hint}")
    # every implementation's full verdict stays one click away
    assert len(_headline(soup)) == len(counts)
    assert soup.find(id="headline").find("details", class_="verdicts") is not None


def _lab(colour: str) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour."""
    rgb = np.array(mcolors.to_rgb(colour))
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                    [0.0193, 0.1192, 0.9505]]) @ lin / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_matrix_cells_are_glyphs_and_counts_in_colours_told_apart(twenty_report):
    # #42 item 10: cells read "3 known_failure, 3 deviation, 3 pass"; known failures and
    # deviations shared nearly one orange
    from reports.tables import OUTCOMES

    css = str(twenty_report.find("style"))
    colours = {o.name: re.search(rf"\.{o.name} {{ background: (#[0-9a-f]{{6}}); }}", css).group(1)
               for o in OUTCOMES}
    names = list(colours)
    for k, a in enumerate(names):
        for b in names[k + 1:]:
            assert np.linalg.norm(_lab(colours[a]) - _lab(colours[b])) >= 20, (a, b)
    assert len({o.glyph for o in OUTCOMES}) == len(OUTCOMES)  # readable without colour
    legend = twenty_report.find(id="outcome-legend")
    assert [li.find(class_="glyph").get_text() for li in legend.find_all("li")[:len(OUTCOMES)]
            ] == [o.glyph for o in OUTCOMES]
    matrix = twenty_report.find("table", class_="matrix")
    glyph = {o.glyph: o.name for o in OUTCOMES}
    seen = set()
    for td in matrix.find_all("td", class_="cell"):
        marks = [(glyph[m.find(class_="glyph").get_text()], int(m.get_text()[1:]))
                 for m in td.find_all(class_="mark")]
        assert marks, td
        assert [o for o, _ in marks] == sorted((o for o, _ in marks), key=names.index)
        assert td["class"][1] == marks[0][0]  # coloured by the worst
        assert td["title"] == ", ".join(f"{n} {next(x.cell for x in OUTCOMES if x.name == o)}"
                                        for o, n in marks)
        seen |= {o for o, _ in marks}
        assert "_" not in td.get_text()
    assert {"fail", "deviation", "pass"} <= seen


def test_headline_fastest_per_band_and_what_was_not_measured(full):
    sec = full.find(id="headline")
    rows = {tr.th.get_text(strip=True): [td.get_text(" ", strip=True) for td in
                                         tr.find_all("td")]
            for tr in sec.find("table", class_="fastest").find_all("tr")}
    assert set(rows) == {"gpu-box cpu float32", "gpu-box cuda float16", "laptop cpu float32",
                         "vm cpu float32"}
    vm = rows["vm cpu float32"]
    assert [c.split(" ")[0] for c in vm] == ["short", "medium", "long"]
    assert vm[2].startswith("long (L 2048–4096) torch.sdpa fastest at 4/4")
    assert re.search(r"\d+% of peak", vm[2])
    assert "torch.sdpa[flash]" in rows["gpu-box cuda float16"][2]
    unmeasured = [a.get_text(" ", strip=True) for a in sec.find("ul", class_="unmeasured")
                  .find_all("a")]
    assert "no measured point: torch.flex" in unmeasured
    assert any(re.fullmatch(r"34 sweep points not measured \(.*26 error.*\)", u)
               for u in unmeasured), unmeasured
    assert "checked but not in the sweep: bug.ignores_mask, jax.nn, torch.nn" in unmeasured


def test_headline_names_interpreted_kernels_never_timed(tmp_path, monkeypatch):
    _unencoded(monkeypatch)  # the headline is read, not the charts
    conf = json.loads((FIXTURES / "real" / "conformance.json").read_text())
    for r in conf["results"]:
        if r["impl"] == "numpy":
            r.update(impl="triton.flash", device="cpu-interpret")
    conf["implementations"].append({**conf["implementations"][0], "name": "triton.flash",
                                    "devices": ["cpu-interpret"]})
    (tmp_path / "conformance.json").write_text(json.dumps(conf))
    soup = _soup(build_report([tmp_path, FIXTURES / "real" / "sweep-a.json"],
                              tmp_path / "r.html"))
    items = [a.get_text(" ", strip=True)
             for a in soup.find(id="headline").find("ul", class_="unmeasured").find_all("a")]
    assert any(i.startswith("interpreted kernels, checked but never timed") and
               i.endswith(": triton.flash") for i in items), items
    assert not any("checked but not in the sweep" in i and "triton.flash" in i for i in items)


def test_a_per_dtype_declaration_shows_per_dtype_in_results_and_report(cli, tmp_path):
    """A policy that depends on the dtype: each dtype's policy in the results JSON, each
    judged and called stale on its own dtype, each on its own line in the report."""
    from tests.conftest import PLUGINS

    out = tmp_path / "conformance.json"
    proc = cli("check", "--plugin", str(PLUGINS / "dtype_policies.py"), "--impl",
               "dtype_policy.right", "--dtype", "float32", "--dtype", "float16", "--workers", "0",
               "-k", "fully_masked_valid_lens or no_mask_self", "--json", str(out),
               "--no-progress")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    listed = {i["name"]: i for i in doc["implementations"]}["dtype_policy.right"]
    declared = listed["deviations"]["fully_masked_rows"]
    assert {d: v["policy"] for d, v in declared.items()} == {
        "float64": "mean_values", "float32": "mean_values", "float16": "nan"}
    # float64 ran no case: not stale (nothing exhibited it); float32 and float16 deviated.
    assert listed["stale_deviations"] == []
    outcomes = {(r["dtype"], r["case"]): r["outcome"] for r in doc["results"]}
    assert outcomes[("float16", "fully_masked_valid_lens")] == "deviation"
    assert outcomes[("float32", "fully_masked_valid_lens")] == "deviation"
    soup = _soup(build_report([out], tmp_path / "r.html"))
    text = " ".join(soup.find(id="implementations").find_next("table").get_text(" ").split())
    assert "fully_masked_rows[float16] : nan: planted" in text, text
    assert "fully_masked_rows[float32] : mean_values: planted" in text


def _at_version(src: dict, impl: str, version: str, created: str, fail_case: str = "") -> dict:
    """``src`` with ``impl``'s recorded framework version set, created at ``created``, and
    ``impl``'s case ``fail_case`` (family/case) failing."""
    doc = json.loads(json.dumps(src))
    doc["created"] = created
    for i in doc["implementations"]:
        if i["name"] == impl:
            i["framework_version"] = version
    for r in doc["results"]:
        if r["impl"] == impl and f"{r['family']}/{r['case']}" == fail_case:
            r.update(outcome="fail", reason="planted: fails at this version only")
    return doc


def test_a_version_matrix_keeps_each_version_apart(tmp_path):
    # Two runs of one machine (`nox -s compat`): jax.nn at an old version failing a case, then
    # at a newer one passing it. The newer file must not replace the older version's cases.
    src = json.loads((FIXTURES / "real" / "conformance.json").read_text())
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "conformance.json").write_text(json.dumps(_at_version(
        src, "jax.nn", "0.4.31", "2026-11-22T12:00:00+00:00", fail_case="masking/none")))
    (tmp_path / "new" / "conformance.json").write_text(json.dumps(_at_version(
        src, "jax.nn", "0.10.2", "2026-11-22T13:00:00+00:00")))
    soup = _soup(build_report([tmp_path / "old", tmp_path / "new"], tmp_path / "r.html"))
    table = soup.find(id="versions").find_next("table")
    header = [th.get_text(strip=True) for th in table.find("tr").find_all("th")]
    rows = {tuple(td.get_text(strip=True) for td in tr.find_all("td")[:2]):
            dict(zip(header, (td.get_text(strip=True) for td in tr.find_all("td"))))
            for tr in table.find_all("tr")[1:]}
    assert set(rows) == {("jax.nn", "jax 0.4.31"), ("jax.nn", "jax 0.10.2")}
    cases = [r for r in src["results"] if r["impl"] == "jax.nn"]
    old, new = rows[("jax.nn", "jax 0.4.31")], rows[("jax.nn", "jax 0.10.2")]
    assert old["worst"] == "fail" and new["worst"] != "fail"
    assert int(old["fail"]) == 1 and int(new["fail"]) == 0
    assert int(old["pass"]) == int(new["pass"]) - 1 == sum(r["outcome"] == "pass" for r in cases) - 1
    assert sum(int(old[o]) for o in OUTCOME_NAMES) == len(cases)
    assert sum(int(new[o]) for o in OUTCOME_NAMES) == len(cases)
    # each version is its own row of the matrix; an implementation at one version keeps its name
    impls = [td.get_text(strip=True) for td in soup.find(id="conformance").select("td.impl")]
    assert sum("jax.nn" in i for i in impls) == 2
    assert any("jax 0.4.31" in i for i in impls) and any("jax 0.10.2" in i for i in impls)
    assert "numpy (vm)" in impls  # one version: the machine's name alone
    listed = soup.find(id="implementations").find_next("table").get_text()
    assert "0.4.31, 0.10.2" in listed


def test_one_version_per_implementation_shows_no_versions_table(tmp_path, monkeypatch):
    _unencoded(monkeypatch)  # the sections are read, not the charts
    soup = _soup(build_report([FIXTURES / "real"], tmp_path / "r.html"))
    assert soup.find(id="versions") is None


def test_one_framework_version_on_two_array_library_versions_stays_apart(tmp_path):
    # flax 0.12.8 on jax 0.10.0 and on jax 0.10.2 (`nox -s compat`'s flax minimum and newest):
    # the framework's version is the same, the environment is not.
    src = json.loads((FIXTURES / "real" / "conformance.json").read_text())
    for name, jax, created, fail in (("old", "0.10.0", "2026-11-22T12:00:00+00:00", "masking/none"),
                                     ("new", "0.10.2", "2026-11-22T13:00:00+00:00", "")):
        doc = _at_version(src, "jax.nn", "0.12.8", created, fail_case=fail)
        doc["machine"]["libraries"].update(jax=jax, jaxlib=jax)
        (tmp_path / name).mkdir()
        (tmp_path / name / "conformance.json").write_text(json.dumps(doc))
    soup = _soup(build_report([tmp_path / "old", tmp_path / "new"], tmp_path / "r.html"))
    table = soup.find(id="versions").find_next("table")
    header = [th.get_text(strip=True) for th in table.find("tr").find_all("th")]
    rows = {r["library version"]: r for r in (
        dict(zip(header, (td.get_text(strip=True) for td in tr.find_all("td"))))
        for tr in table.find_all("tr")[1:]) if r["implementation"] == "jax.nn"}
    assert set(rows) == {"jax 0.12.8 on jax 0.10.0, jaxlib 0.10.0",
                         "jax 0.12.8 on jax 0.10.2, jaxlib 0.10.2"}
    assert rows["jax 0.12.8 on jax 0.10.0, jaxlib 0.10.0"]["fail"] == "1"
    assert rows["jax 0.12.8 on jax 0.10.2, jaxlib 0.10.2"]["fail"] == "0"


# --- shares of peak the report does not vouch for ---------------------------------------
def _sweep_with_peaks(out: Path, runs: dict, faster: dict = None) -> Path:
    """The vm sweep with its peaks' before/after measurements ``runs`` ({key: (before,
    after)}) and the implementations of ``faster`` ({impl: factor}) that much faster."""
    sweep = json.loads((FIXTURES / "vm" / "sweep_vm.json").read_text())
    facts = sweep["machine_info"]["mha_suite"]
    for key, (before, after) in runs.items():
        best = max(before, after)
        facts["matmul_peak_flops"][key] = best
        facts.setdefault("matmul_peak_runs", {})[key] = {
            "before": before, "after": after, "spread": abs(before - after) / best}
    for b in sweep["benchmarks"]:
        factor = (faster or {}).get(b["extra_info"]["impl"])
        if factor:
            for k in ("min", "max", "mean", "median", "q1", "q3", "iqr", "stddev"):
                b["stats"][k] /= factor
            b["extra_info"]["flops_per_s"] *= factor
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(sweep))
    return out


def _flagged_points(ok, monkeypatch) -> dict:
    """{chart title: {implementation: panels whose share it crosses out}} of the throughput
    charts, read from the drawn figures."""
    drawn = []
    monkeypatch.setattr(figures, "to_data_uri", lambda fig, tight=True: drawn.append(fig) or "")
    charts = figures.throughput(ok)
    out = {}
    for fig, chart in zip(drawn, charts):
        marks = out.setdefault(chart.title, {})
        for ax in fig.axes:
            title = next((t.get_text() for t in ax.texts if t.get_gid() == figures.TITLE_GID), "")
            for c in ax.collections:
                gid = str(c.get_gid() or "")
                if gid.startswith(figures.FLAG_GID):
                    marks.setdefault(gid[len(figures.FLAG_GID):], set()).add(title.split(" · ")[-1])
    return out


STEADY = {"numpy:cpu:float32": (299.9e9, 296e9), "torch:cpu:float32": (309.5e9, 301e9),
          "jax:cpu:float32": (285.1e9, 280e9)}


def test_a_share_above_the_peak_and_a_wide_peak_spread_are_flagged(tmp_path, monkeypatch):
    # numpy.flash 8x faster: 124% of the numpy peak; torch's peak 29% apart before/after
    runs = {**STEADY, "torch:cpu:float32": (309.5e9, 220e9)}
    src = _sweep_with_peaks(tmp_path / "r", runs, {"numpy.flash": 8})
    build_report([src], tmp_path / "report.html")
    soup = _soup(tmp_path / "report.html")
    note = soup.find(id="headline").find("p", class_="untrusted-shares")
    assert note is not None, "no sentence on the shares that cannot be trusted"
    text = note.get_text(" ", strip=True)
    assert re.search(r"numpy\.flash on cpu float32 \(up to 12\d%\)", text), text
    assert "above 100% of the measured peak" in text
    assert "cpu float32, spread 29%, used by torch.eager, torch.sdpa" in text, text
    assert "more than 20%" in text
    assert "numpy on" not in text and "jax.jit" not in text  # their shares hold
    # the headline's fastest cells mark a flagged share
    cells = [td.get_text(" ", strip=True) for td in
             soup.find(id="headline").find("table", class_="fastest").find_all("td")]
    for c in cells:
        flagged = c.split(" fastest")[0].split()[-1] in ("numpy.flash", "torch.sdpa",
                                                          "torch.eager")
        assert ("⚠" in c) == (flagged and "of peak" in c), c
    # the charts: a cross on each flagged implementation's share, none on the FLOP/s
    ok = load_sweeps([src]).query("status == 'ok'")
    marks = _flagged_points(ok, monkeypatch)
    assert len(marks) == 1
    (title, flagged), = marks.items()
    assert set(flagged) == {"numpy.flash", "torch.eager", "torch.sdpa"}
    assert all(panels == {"% of measured matmul peak"} for panels in flagged.values())
    assert title.endswith("shares not to be trusted (red crosses): numpy.flash, torch.eager, "
                          "torch.sdpa")
    img = soup.find(id="throughput").find("img")
    assert "shares not to be trusted" in img["alt"]


def test_shares_that_hold_are_not_flagged(tmp_path, monkeypatch):
    src = _sweep_with_peaks(tmp_path / "r", STEADY)  # every share under 50%, spreads ~3%
    with monkeypatch.context() as m:  # the headline and the charts' alt text are read
        _unencoded(m)
        build_report([src], tmp_path / "report.html")
    soup = _soup(tmp_path / "report.html")
    assert soup.find(id="headline").find("p", class_="untrusted-shares") is None
    assert "⚠" not in soup.find(id="headline").get_text()
    assert "not to be trusted" not in soup.find(id="throughput").find("img")["alt"]
    ok = load_sweeps([src]).query("status == 'ok'")
    marks = _flagged_points(ok, monkeypatch)  # drawn once: the same figures each time
    assert marks == {next(iter(marks)): {}}


def test_the_conformance_section_states_the_rule_the_suite_applies(full):
    from suite.spec import agreement

    sec = full.find(id="conformance")
    assert sec.find("code", class_="rule").get_text() == agreement.RULE_TEXT
    assert sec.find(class_="rule-k").get_text() == agreement.RULE_K_TEXT
    assert sec.find(class_="rule-terms").get_text() == agreement.RULE_TERMS
    # the words say what Comparison.bound computes: k times the larger of the two, plus atol
    c = agreement.Comparison("output", err=0.0, err_naive=1.0, k=2.0, atol=0.5, err_model=3.0)
    assert "max(err(naive_t), model_t)" in agreement.RULE_TEXT and c.bound == 2.0 * 3.0 + 0.5
    assert f"{agreement.K_FORWARD:g}" in agreement.RULE_K_TEXT


def _isa_cards(tmp_path, monkeypatch, conformance_native, sweep_native) -> dict:
    """{kind: its card's CPU levels} of a report of the vm's conformance file (its records run
    at default, avx2 and avx512) and sweep, each recording ``*_native`` as its native level."""
    conf = json.loads((FIXTURES / "vm" / "conformance_vm.json").read_text())
    sweep = json.loads((FIXTURES / "vm" / "sweep_vm.json").read_text())
    facts = sweep["machine_info"]["mha_suite"]
    conf["machine_info"] = {"node": "vm", "system": conf["machine"].get("system"),
                            "mha_suite": {"cpu_model": facts["cpu_model"],
                                          "libraries": conf["machine"].get("libraries"),
                                          "isa_native": conformance_native}}
    facts["isa_native"] = sweep_native
    for i, r in enumerate(conf["results"]):  # a run at every level: default, avx2, native
        r["isa"] = ("avx512", "avx2", "default")[i % 3] if r["impl"] != "numpy" else None
    (tmp_path / "conformance.json").write_text(json.dumps(conf))
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    with monkeypatch.context() as m:  # the cards are read, not the charts
        _unencoded(m)
        build_report([tmp_path / "conformance.json", tmp_path / "sweep.json"],
                     tmp_path / "report.html")
    cards = _soup(tmp_path / "report.html").find(id="environment").find_all(class_="card")
    assert {c.find(class_="name").get_text() for c in cards} == {"vm"}  # one machine
    return {c.find(class_="tag").get_text(): c.find(class_="isa") for c in cards}


def test_the_environment_card_shows_the_native_cpu_level_and_the_levels_run(tmp_path,
                                                                          monkeypatch):
    cards = _isa_cards(tmp_path, monkeypatch, "avx512", None)
    assert cards["conformance"].get_text() == "native avx512; ran at default, avx2, avx512"


def test_the_cards_of_one_machine_agree_on_its_native_level(tmp_path, monkeypatch):
    # #42 item 11: the main job's conformance file (written where torch was never imported)
    # records no native level, its sweep does: the cards said "native not recorded; ran at
    # default, avx2, avx512" beside "native avx512; ran at none recorded"
    cards = _isa_cards(tmp_path, monkeypatch, None, "avx512")
    assert cards["conformance"].get_text() == "native avx512; ran at default, avx2, avx512"
    assert cards["sweep"].get_text() == ("native avx512; points record no level: torch's "
                                         "native one unless ATEN_CPU_CAPABILITY pinned another")
    cards = _isa_cards(tmp_path, monkeypatch, None, None)  # recorded nowhere: said so, the levels run kept
    assert cards["conformance"].get_text() == "native not recorded; ran at default, avx2, avx512"
    assert cards["sweep"] is None


def test_machine_facts_record_the_native_level_once_torch_ran(monkeypatch):
    import sys
    import types

    from suite.plugins import isa
    from suite.sweep import timing

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert timing.machine_facts()["isa_native"] is None  # no torch here: no child started
    fake = types.SimpleNamespace(backends=types.SimpleNamespace(cpu=types.SimpleNamespace(
        get_cpu_capability=lambda: "AVX512")), cuda=types.SimpleNamespace(
        is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.delenv(isa.TORCH_ENV, raising=False)
    assert timing.machine_facts()["isa_native"] == "avx512"


# --- memory points the report does not vouch for ------------------------------------------
def _sweep_with_memory(out: Path, planted: dict) -> Path:
    """The vm sweep measured by the RSS method, with ``planted`` ({(impl, mask, L): MiB}) at
    H=8 in place of what was measured."""
    sweep = json.loads((FIXTURES / "vm" / "sweep_vm.json").read_text())
    for b in sweep["benchmarks"]:
        x = b["extra_info"]
        x["peak_method"] = "rss_hwm_delta"
        mib = planted.get((x["impl"], x["mask"], x["Lq"])) if x["H"] == 8 else None
        if mib is not None:
            x["peak_bytes"] = int(mib * 2**20)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(sweep))
    return out / "sweep.json"


def test_memory_points_that_cannot_hold_are_marked_and_left_out_of_their_lines(
        tmp_path, monkeypatch):
    # #42 item 11: jax's RSS rise read 150 MiB at one length and 15 MiB at the next, and a
    # rise of a few hundred KiB is the allocator's noise; the chart drew both as data
    src = _sweep_with_memory(tmp_path / "r", {("jax.jit", "none", 2048): 12.0,
                                               ("numpy.flash", "causal", 128): 0.4})
    ok = load_sweeps([src]).query("status == 'ok'")
    why = ok.dropna(subset=["memory_untrusted"]).set_index(["impl", "mask", "H", "L"])[
        "memory_untrusted"].to_dict()
    assert set(why) == {("jax.jit", "none", 8, 2048), ("numpy.flash", "causal", 8, 128)}
    assert why[("jax.jit", "none", 8, 2048)] == "12 MiB, less than the 83.7 MiB of a shorter length"
    assert why[("numpy.flash", "causal", 8, 128)] == "RSS rise 410 KiB, under the 1 MiB noise floor"
    drawn = []
    monkeypatch.setattr(figures, "to_data_uri", lambda fig, tight=True: drawn.append(fig) or "")
    chart, = figures.memory_vs_length(ok)
    assert chart.title.endswith("points not to be trusted (red crosses, left out of their "
                                "lines): jax.jit, numpy.flash")
    crosses, lines = {}, {}
    for ax in drawn[0].axes:
        for c in ax.collections:
            if str(c.get_gid() or "").startswith(figures.FLAG_GID):
                crosses.setdefault(c.get_gid()[len(figures.FLAG_GID):], []).extend(
                    np.round(c.get_offsets()[:, 0]).astype(int).tolist())
        for line in ax.get_lines():
            if line.get_gid():
                lines.setdefault(line.get_gid(), []).append(line.get_xdata().tolist())
    assert crosses == {"jax.jit": [2048], "numpy.flash": [128]}
    # the flagged points are no part of their lines; the other lines keep every length
    assert sorted(map(len, lines["jax.jit"])) == [4, 5]
    assert sorted(map(len, lines["numpy.flash"])) == [5, 6]
    assert [128, 256, 512, 1024, 2048, 4096] in lines["torch.sdpa"]
    soup = _soup(build_report([src], tmp_path / "report.html"))
    sec = soup.find(id="memory")
    assert sec.find(class_="memory-untrusted").get_text() == (
        "Not trusted: jax.jit at L 2048; numpy.flash at L 128.")
    assert "under 1 MiB" in sec.find(class_="memory-trust").get_text()
    assert "not to be trusted" in sec.find("img")["alt"]


def test_memory_that_grows_with_the_length_is_trusted(tmp_path, monkeypatch):
    ok = load_sweeps([_sweep_with_memory(tmp_path / "r", {})]).query("status == 'ok'")
    assert ok["memory_untrusted"].isna().all()
    _unencoded(monkeypatch)  # the memory section's text and its chart's alt text are read
    soup = _soup(build_report([tmp_path / "r"], tmp_path / "report.html"))
    assert soup.find(id="memory").find(class_="memory-untrusted") is None
    assert "not to be trusted" not in soup.find(id="memory").find("img")["alt"]


# --- end labels that stay legible -----------------------------------------------------------
def _many_torch(twenty: Path, n: int = 14) -> pd.DataFrame:
    """numpy's points of the twenty-implementation results as ``n`` torch implementations,
    times spread and crossing; every third stops at L = 512 (a per-shape compiler sampled
    at fewer lengths), so its end is left of the others'."""
    ok = load_sweeps([twenty]).query("status == 'ok' and impl == 'numpy'")
    parts = []
    for i in range(n):
        p = ok.assign(impl=f"torch.v{i:02d}", framework="torch",
                      median_s=ok["median_s"] * 1.15 ** i * (ok["L"] / 512) ** (0.1 * (i % 4 - 2)))
        parts.append(p[p["L"] <= 512] if i % 3 == 0 else p)
    return pd.concat(parts, ignore_index=True)


def _segments_cross(a, b) -> bool:
    """Whether two segments ((x, y), (x, y)) cross at a point inside both."""
    def side(p, q, r):
        return np.sign((q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0]))
    return (side(*a, b[0]) * side(*a, b[1]) < 0) and (side(*b, a[0]) * side(*b, a[1]) < 0)


def test_a_large_family_is_split_into_panels_whose_leaders_never_cross(twenty, monkeypatch):
    # #42 item 12: the torch panels stacked 12-14 end labels with crossing leader lines
    many = _many_torch(twenty)
    styles = figures.impl_styles(many)
    panels = figures.split_panels(many["impl"], styles)
    assert sorted(collections.Counter(panels.values()).items()) == [
        ("torch (1 of 2)", 7), ("torch (2 of 2)", 7)]
    drawn = []
    monkeypatch.setattr(figures, "to_data_uri", lambda fig, tight=True: drawn.append(fig) or "")
    chart, = figures.time_vs_length(many, styles)
    assert sorted(chart.labels) == sorted(panels)
    fig = drawn[0]
    for ax, boxes in zip(fig.axes, _label_boxes(fig)):
        if not boxes:
            continue
        title = next(t.get_text() for t in ax.texts if t.get_gid() == figures.TITLE_GID)
        assert len(boxes) <= figures.MAX_LINES and title.startswith("torch (")
        to_px = ax.transAxes.transform
        leaders = {c.get_gid()[len(figures.LEADER_GID):]: [to_px(np.asarray(seg)) for seg in
                                                            c.get_segments()]
                   for c in ax.collections
                   if str(c.get_gid() or "").startswith(figures.LEADER_GID)}
        assert sorted(leaders) == sorted(boxes)  # every label has its leader
        ends = {line.get_gid(): ax.transData.transform(np.column_stack(line.get_data())[-1])
                for line in ax.get_lines() if line.get_gid()}
        for name, segs in leaders.items():
            assert np.allclose(segs[0][0], ends[name], atol=1.0), name  # from the line's end
            box = boxes[name]
            assert box.x0 - 8 <= segs[-1][1][0] <= box.x0 and box.y0 <= segs[-1][1][1] <= box.y1
        names = sorted(leaders)
        for k, a in enumerate(names):
            for b in names[k + 1:]:
                for sa in leaders[a]:
                    for sb in leaders[b]:
                        assert not _segments_cross(sa, sb), (title, a, b)


def test_head_count_chart_leaves_out_what_was_timed_at_one_head_count(twenty, tmp_path,
                                                                      monkeypatch):
    # #42 item 12: implementations the sampled run timed at one head count were single
    # labelled points among the lines
    sweep = json.loads((twenty / "sweep-20.json").read_text())
    single = ("jax.nn", "mymha")
    sweep["benchmarks"] = [b for b in sweep["benchmarks"] if not (
        b["extra_info"]["impl"] in single and b["extra_info"]["H"] != 8)]
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "sweep.json").write_text(json.dumps(sweep))
    ok = load_sweeps([tmp_path / "r"]).query("status == 'ok'")
    chart, = figures.time_vs_heads(ok)
    # the charts below are drawn in full, not encoded: the head-count chart was just now,
    # and the others are the twenty implementations' report's (the length sweep is theirs)
    _unencoded(monkeypatch)
    length, = figures.time_vs_length(ok)  # in the length sweep they have lines
    assert not set(single) & set(chart.labels)
    assert set(chart.labels) == {n for n, _ in TWENTY} - set(single)
    assert chart.note == "Left out, timed at a single head count here (no line to draw): " \
        "jax.nn, mymha."
    assert set(single) <= set(length.labels) and length.note == ""
    soup = _soup(build_report([tmp_path / "r"], tmp_path / "report.html"))
    note = soup.find(id="heads").find("p", class_="chart-note")
    assert note.get_text() == chart.note and chart.note in soup.find(id="heads").img["alt"]
