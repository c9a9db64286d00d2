"""docs/results.md and README.md's table of headline figures, made from benchmarks/results/*.json.

Each JSON file there with a "claims" list holds one claim group (a design or a topic); each
record is one claim as the log (docs/benchmark_log.md) last measured it. Files without
"claims" (raw outputs such as sidp_probe_h200.json) are skipped. Usage:

    python3 benchmarks/results_table.py          # rewrite docs/results.md and README.md's table
    python3 benchmarks/results_table.py --check  # exit 1 if either differs from the JSON
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_MD = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
README_BEGIN = ("<!-- results table: made by benchmarks/results_table.py; "
                "edit the JSON, not this -->")
README_END = "<!-- end of results table -->"

REQUIRED = ("id", "claim", "device", "shape", "workload", "plan", "metric", "unit", "better",
            "figure", "command", "date", "log_section")
WITH_BASELINE = ("baseline_plan", "ratio", "baseline_other_call")
RATIO_TOLERANCE = 0.002
PAR_BAND = 0.02  # within 2% of the baseline reads "on par"
GROUP_ORDER = ("shift", "seesaw", "flying", "sidp", "deterministic", "moe", "single_gpu",
               "host_overhead")


def load_groups(folder: Path = RESULTS) -> tuple[list[dict], list[str]]:
    """The claim groups in file-name order, and the names of the files skipped (no claims)."""
    groups, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "claims" in doc:
            groups.append(doc | {"file": path.name})
        elif not (isinstance(doc, dict) and ("validation" in doc or "comparison" in doc)):
            skipped.append(path.name)
    rank = {name: i for i, name in enumerate(GROUP_ORDER)}
    groups.sort(key=lambda g: (rank.get(g["group"], len(rank)), g["group"]))
    return groups, skipped


def problems(record: dict) -> list[str]:
    """What a claim record lacks or gets wrong; empty when it is whole."""
    name = record.get("id", "?")
    found = [f"{name}: no {field}" for field in REQUIRED if record.get(field) in (None, "")]
    if not (record.get("commit") or record.get("session")):
        found.append(f"{name}: neither a commit nor a session")
    if record.get("better") not in ("higher", "lower"):
        found.append(f"{name}: better must be 'higher' or 'lower'")
    if record.get("baseline") is None:
        if record.get("floor") is None:
            found.append(f"{name}: neither a baseline nor a floor")
        return found
    found += [f"{name}: no {field}" for field in WITH_BASELINE if field not in record]
    if "ratio" in record and isinstance(record.get("figure"), (int, float)):
        expected = record["figure"] / record["baseline"]
        if abs(record["ratio"] - expected) > RATIO_TOLERANCE * max(1.0, expected):
            found.append(f"{name}: ratio {record['ratio']} is not figure / baseline "
                         f"({expected:.3f})")
    return found


def all_problems(groups: list[dict]) -> list[str]:
    found, seen = [], set()
    for group in groups:
        for record in group["claims"]:
            found += problems(record)
            if record.get("id") in seen:
                found.append(f"{record.get('id')}: id used twice")
            seen.add(record.get("id"))
    return found


def number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,}"


def verdict(record: dict) -> str:
    """Whether the claim's figure beats its baseline, read in the metric's direction."""
    if record.get("baseline") is None:
        return "–"
    gain = record["ratio"] if record["better"] == "higher" else 1 / record["ratio"]
    if abs(gain - 1) <= PAR_BAND:
        return "on par"
    return "better" if gain > 1 else "worse"


def fraction_of_floor(record: dict) -> float:
    floor, figure = record["floor"], record["figure"]
    return floor / figure if record["better"] == "lower" else figure / floor


def floor_cell(record: dict) -> str:
    if record.get("floor") is None:
        return ""
    return f"{number(record['floor'])} ({fraction_of_floor(record):.2f})"


def baseline_cell(record: dict) -> str:
    if record.get("baseline") is None:
        return "–"
    mark = " †" if record["baseline_other_call"] else ""
    return f"{record['baseline_plan']}: {number(record['baseline'])}{mark}"


def measured_at(record: dict) -> str:
    where = f"`{record['commit']}`" if record.get("commit") else record["session"]
    return f"{record['date']}, {where}"


def table_row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def claim_row(r: dict) -> str:
    ratio = f"{r['ratio']:.3f}" if r.get("baseline") is not None else "–"
    notes = [f"goal: {r['goal']}"] if r.get("goal") else []
    notes += [r["note"]] if r.get("note") else []
    metric = f"{r['metric']} ({r['better']} is better)"
    return table_row([r["claim"], r["device"], f"`{r['shape']}`", r["workload"], r["plan"], metric,
                      f"{number(r['figure'])} {r['unit']}", baseline_cell(r), ratio, verdict(r),
                      floor_cell(r), measured_at(r), f"`{r['command']}`", "; ".join(notes)])


RESULTS_INTRO = """# Results: the current figure of every claim

Made by `benchmarks/results_table.py` from `benchmarks/results/*.json`; do not edit by hand.
Each row is a claim's latest measurement in the dated log (`docs/benchmark_log.md`, in the
section the JSON names). The baseline is the best static plan where a policy is claimed
(DP included), else what the row names. Ratio = figure ÷ baseline; the verdict reads it in
the metric's direction (on par: within 2%). † marks a baseline from another call or commit
than the figure's. Floor: the roofline bound the log gives (bytes at the copy rate, FLOPs at
the matrix rate), with the fraction of it reached. Decode floors of rows measured before
session 46's last call (2026-11-30) counted the whole input embedding table as read
each step (1.05 GB of the 8B's 9.09 GB in FP8, 0.62 GB of Qwen3-30B-A3B's touched bytes); a
step gathers one row a sequence, so those floors read 4-13% high at one row and their
fractions as much too high; session 46's rows give both. Shapes are `benchmarks/shapes/*.json`
with random bf16 weights.
"""
RESULTS_COLUMNS = ("claim", "device", "shape", "workload", "plan", "metric", "figure", "baseline",
                   "ratio", "verdict", "floor (fraction)", "measured", "command", "notes")
README_COLUMNS = ("design", "claim", "plan: figure", "baseline (same call unless †) or floor",
                  "ratio, verdict", "device", "date")


def header(columns: tuple[str, ...]) -> list[str]:
    return [table_row(list(columns)), "|" + "---|" * len(columns)]


def load_validations(folder: Path = RESULTS) -> list[dict]:
    """Files of predictions beside measurements ("validation" rows: the cost model's)."""
    docs = [json.loads(path.read_text()) | {"file": path.name}
            for path in sorted(folder.glob("*.json"))]
    return [doc for doc in docs if "validation" in doc]


VALIDATION_COLUMNS = ("row", "GPUs", "shape", "what", "measured", "predicted", "error",
                      "held out", "log section")


def validation_row(r: dict) -> str:
    bound = "> " if r.get("measured_is") else ""  # a cut run: it took at least this
    return table_row([f"`{r['id']}`", str(r["gpus"]), f"`{r['shape']}`", r["what"],
                      f"{bound}{number(r['measured'])} {r['unit']}", f"{number(r['predicted'])}",
                      f"{100 * r['error']:+.1f}%", "fit" if r["fit"] else "yes",
                      r["log_section"]])


def summary_notes(summary: dict) -> list[str]:
    """A summary's items, then its notes (row id: why) one a line."""
    notes = [f"- {k.replace('_', ' ')}: {v}" for k, v in summary.items() if k != "notes"]
    return notes + [f"- {row_id}: {why}" for row_id, why in summary.get("notes", {}).items()]


def render_validation(doc: dict) -> list[str]:
    notes = summary_notes(doc["summary"])
    return [f"## {doc['title']}", "", f"From `benchmarks/results/{doc['file']}` "
            f"({doc['source']}).", "", *notes, "", *header(VALIDATION_COLUMNS),
            *map(validation_row, doc["validation"]), ""]


COMPARISON_COLUMNS = ("row", "GPUs", "shape", "workload", "policy", "deciding metric",
                      "ratio", "throughput / E2E / TTFT / TPOT ratios", "best static", "policy's plans")


def load_comparisons(folder: Path = RESULTS) -> list[dict]:
    """Files of policies against the best static plan ("comparison" rows: the simulator's)."""
    docs = [json.loads(path.read_text()) | {"file": path.name}
            for path in sorted(folder.glob("*.json"))]
    return [doc for doc in docs if isinstance(doc, dict) and "comparison" in doc]


def comparison_row(r: dict) -> str:
    if "ratio" not in r:
        return table_row([f"`{r['id']}`", str(r["gpus"]), f"`{r['shape']}`", r["workload"],
                          r["policy"], r["metric"], "not run", r["not_run"], r["best_static"],
                          "–"])
    ratios = " / ".join(f"{r['ratios'][m]:.3f}" for m in ("throughput", "e2el_ms", "ttft_ms", "tpot_ms"))
    mark = "" if r["passes"] else " (below the bar)"
    return table_row([f"`{r['id']}`", str(r["gpus"]), f"`{r['shape']}`", r["workload"],
                      r["policy"], r["metric"], f"{r['ratio']:.3f}{mark}", ratios,
                      r["best_static"], ", ".join(r["policy_figures"]["plans"][:4])])


def render_comparison(doc: dict) -> list[str]:
    notes = summary_notes({**doc["scale"], **doc["summary"]})
    return [f"## {doc['title']}", "", f"From `benchmarks/results/{doc['file']}` "
            f"({doc['source']}).", "", *notes, "", *header(COMPARISON_COLUMNS),
            *map(comparison_row, doc["comparison"]), ""]


def render_results(groups: list[dict], skipped: list[str],
                   validations: list[dict] | None = None) -> str:
    lines = [RESULTS_INTRO]
    for group in groups:
        lines += [f"## {group['title']}", "", f"From `benchmarks/results/{group['file']}`.", "",
                  *header(RESULTS_COLUMNS), *map(claim_row, group["claims"]), ""]
    for doc in load_validations() if validations is None else validations:
        lines += render_validation(doc)
    for doc in load_comparisons():
        lines += render_comparison(doc)
    if skipped:
        names = ", ".join(f"`{name}`" for name in skipped)
        lines += [f"Files in `benchmarks/results/` with no claim records (raw outputs, not rows "
                  f"here): {names}.", ""]
    return "\n".join(lines)


def headline_row(design: str, r: dict) -> str:
    if r.get("baseline") is None:
        compared = f"floor {number(r['floor'])} {r['unit']} (fraction {fraction_of_floor(r):.2f})"
        judged = "–"
    else:
        compared = f"{baseline_cell(r)} {r['unit']}"
        judged = f"{r['ratio']:.3f}, {verdict(r)}"
    figure = f"{r['plan']}: {number(r['figure'])} {r['unit']} {r['metric']}"
    return table_row([design, r["claim"], figure, compared, judged, r["device"], r["date"]])


def render_readme_table(groups: list[dict]) -> str:
    lines = header(README_COLUMNS)
    for group in groups:
        design = group["title"].split(" (")[0].split(":")[0]
        lines += [headline_row(design, r) for r in group["claims"] if r.get("headline")]
    return "\n".join(lines)


def with_readme_table(readme: str, table: str) -> str:
    head, begin, rest = readme.partition(README_BEGIN)
    _, end, tail = rest.partition(README_END)
    if not begin or not end:
        raise SystemExit(f"README.md lacks the markers {README_BEGIN!r} … {README_END!r}")
    return f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the docs differ from the JSON")
    args = parser.parse_args(argv)
    groups, skipped = load_groups()
    found = all_problems(groups)
    if found:
        print("\n".join(found), file=sys.stderr)
        return 1
    wanted = {RESULTS_MD: render_results(groups, skipped),
              README: with_readme_table(README.read_text(), render_readme_table(groups))}
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from benchmarks/results/*.json: "
                  "run python3 benchmarks/results_table.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
    return 0


if __name__ == "__main__":
    sys.exit(main())
