"""Stage 4 orchestration: load eval results, compute tables/CIs/plots/patterns, write report.md atomically."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sage_unsloth.report import formatting, grouping, multi_seed, plots, support, tables, training
from sage_unsloth.report import patterns as pat
from sage_unsloth.report.config import ReportArguments, parse_args
from sage_unsloth.report.loading import discover_runs
from sage_unsloth.report.paper import (
    UNTRACED_LEGEND,
    kl_placement,
    load_mapping,
    load_published,
    map_run,
    paper_number,
)
from sage_unsloth.report.tables import md_table
from sage_unsloth.runtime.manifest import atomic_write_text, write_manifest

log = logging.getLogger(__name__)
WANDB_RESULTS = "wandb"  # <results>/wandb/: the evaluations --from_wandb read, as results folders

__all__ = ["ReportArguments", "ReportResult", "build_report", "parse_args"]


@dataclass
class ReportResult:
    markdown: str
    comparison: pd.DataFrame
    curves: pd.DataFrame
    pairs: pd.DataFrame
    patterns: pd.DataFrame
    images: dict[str, Path]
    out: Path
    support: pd.DataFrame | None = None
    training: pd.DataFrame | None = None
    seeds: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)  # the multi-seed mode's tables


# ---------------------------------------------------------------- formatting
def _paper_cell(row) -> str:
    if pd.isna(row["paper"]):
        return ""
    return paper_number(row["paper"], row["paper_primary"])


def dataset_section(comparison: pd.DataFrame, dataset: str) -> str:
    frame = comparison[comparison["dataset"] == dataset]
    rows = []
    for (model, run), group in frame.groupby(["model", "run"], sort=False):
        one = group[group["metric"] == "pass@1"].iloc[0]
        big = group[group["metric"] == "pass@k"].iloc[0]
        k = "" if pd.isna(big["k"]) else int(big["k"])
        rows.append(
            [
                f"{model}/{run}",
                "—" if pd.isna(one["method"]) or not one["method"] else one["method"],
                formatting.number(one["value"]),
                formatting.interval(one["ci_low"], one["ci_high"]),
                _paper_cell(one),
                formatting.number(one["diff"], signed=True, empty=""),
                k,
                formatting.number(big["value"]),
                formatting.interval(big["ci_low"], big["ci_high"]),
                _paper_cell(big),
                formatting.number(big["diff"], signed=True, empty=""),
            ]
        )
    header = ["run", "paper method", "pass@1", "95% CI", "paper", "Δ", "k", "pass@k", "95% CI", "paper", "Δ"]
    return md_table(header, rows)


_SAMPLING_KEYS = ("n", "n_samples", "temperature", "top_p", "min_p", "max_new_tokens", "max_tokens", "seed")


def sampling_summary(manifest: dict | None) -> str:
    """ "key=value" for the sampling parameters found anywhere in an eval manifest (first occurrence wins)."""
    found: dict = {}

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _SAMPLING_KEYS and key not in found and isinstance(value, (int, float, str)):
                    found[key] = value
                else:
                    walk(value)

    walk(manifest or {})
    return ", ".join(f"{k}={found[k]}" for k in _SAMPLING_KEYS if k in found)


def _ungraded(manifest: dict) -> str:
    """Completions whose grading ran out of budget twice (counted as not correct), from the eval manifest."""
    unresolved = (manifest.get("grading") or {}).get("unresolved")
    return "?" if unresolved is None else str(unresolved)


def _source(args: ReportArguments) -> str:
    if args.from_wandb:
        group = f", group `{args.wandb_group}`" if args.wandb_group else ""
        return f"W&B `{args.from_wandb}`{group} (as results folders in `{args.results}`)"
    return f"`{args.results}`"


def render_markdown(
    args: ReportArguments,
    runs,
    result: ReportResult,
    published_patterns: pd.DataFrame,
    mapping,
) -> str:
    out_dir = result.out.parent
    rel = lambda p: Path(p).resolve().relative_to(out_dir.resolve()).as_posix()
    parts = [
        "# SAGE reproduction report",
        (
            f"Generated {_dt.datetime.now(_dt.UTC).isoformat(timespec='seconds')} from {_source(args)}. "
            "Point values: the eval stage's passk.csv (unbiased pass@k). "
            f"CIs: {int(args.level * 100)}% percentile bootstrap over problems ({args.resamples} resamples, "
            f"seed {args.seed}); avg_paper resamples within each set. Paper values from results/paper/, each "
            f"with its source ({UNTRACED_LEGEND}). "
            'Δ = run − paper. "missing" = the run did not report that dataset or k.'
        ),
        *runs_section(runs, mapping),
    ]
    for dataset in tables.report_datasets(runs):
        title = tables.DATASET_TITLES.get(dataset, dataset)
        parts += [f"## {title}", dataset_section(result.comparison, dataset)]
        if dataset in result.images:
            parts.append(f"![pass@k on {dataset}]({rel(result.images[dataset])})")
    parts.append(
        f"Every reported k with its CI: `{result.out.stem}/passk_all_k.csv`; "
        f"these tables: `{result.out.stem}/comparison.csv`."
    )
    parts += pairs_section(result.pairs)
    if result.seeds:
        parts.append(multi_seed.markdown_section(result.seeds, result.out.stem).rstrip("\n"))
    parts += patterns_section(args, result, published_patterns, mapping)
    return "\n\n".join(parts) + "\n"


def runs_section(runs, mapping) -> list[str]:
    """The report's "Runs" section: one row per run (its paper row, KL placement, checkpoint, sampling, the ks
    reported, what grading left ungraded, notes), then how runs map to the paper's rows."""
    run_rows = []
    for run in runs:
        row = map_run(run.model, run.run, mapping)
        manifest = run.manifest or {}
        checkpoint = manifest.get("checkpoint") or (manifest.get("config") or {}).get("checkpoint", "")
        ks = run.reported_ks()
        run_rows.append(
            [
                run.name,
                row.model or "—",
                row.method or "— (no paper row)",
                kl_placement(run.run, manifest, run.stage_folder),
                str(checkpoint or ""),
                sampling_summary(manifest),
                f"{ks[0]}–{ks[-1]}" if ks else "none",
                _ungraded(manifest),
                "; ".join(run.notes) or "ok",
            ]
        )
    header = [
        "run",
        "paper model",
        "paper method",
        "KL placement",
        "checkpoint",
        "sampling",
        "k reported",
        "ungraded",
        "notes",
    ]
    return [
        "## Runs",
        md_table(header, run_rows),
        (
            "ungraded: completions whose grading ran out of its CPU budget in the run and again in the serial retry "
            "(counted as not correct; `grading` in the run's eval manifest)."
        ),
        (
            "Run → paper mapping (by folder name, override with --mapping): model folder containing "
            "qwen2.5-math-7b or deepseek-r1-distill-qwen-7b; run folder (lower-cased, seed suffix dropped) "
            "base/sft → Base, grpo → GRPO, grpo_branch → GRPO + Branch, bnpo[_branch], dapo[_branch] likewise. "
            "pass@k uses the paper's k for the model (256 / 64), else the largest k the run reported. KL placement: "
            "loss = per-token KL in the loss (the paper's code), reward = the sequence-level pseudo-KL in the reward "
            "(sage_kl_placement), read from the RLVR manifest of the evaluated checkpoint."
        ),
    ]


def pairs_section(pairs: pd.DataFrame) -> list[str]:
    """The paired differences A − B, each with its CI and whether the CI excludes 0."""
    title = "## Paired differences (A − B, same resampled problems for both runs)"
    if pairs.empty:
        return [
            title,
            "No run pairs (give --pairs run_a:run_b, or name runs so that the paper mapping pairs them).",
        ]
    rows = []
    for _, r in pairs.iterrows():
        excludes = "" if pd.isna(r["ci_low"]) else ("yes" if r["ci_low"] > 0 or r["ci_high"] < 0 else "no")
        rows.append(
            [
                r["model"],
                r["run_a"],
                r["run_b"],
                r["dataset"],
                r["metric"],
                "" if pd.isna(r["k"]) else int(r["k"]),
                formatting.number(r["diff"], signed=True, empty="") or "missing",
                formatting.interval(r["ci_low"], r["ci_high"]),
                excludes,
                int(r["n_problems"]),
            ]
        )
    header = ["model", "A", "B", "dataset", "metric", "k", "A − B", "95% CI", "CI excludes 0", "problems"]
    return [title, md_table(header, rows)]


def patterns_section(args: ReportArguments, result: ReportResult, published_patterns, mapping) -> list[str]:
    """The reasoning patterns' fractions per run, with the paper's value in parentheses where it has one."""
    parts = ["## Reasoning patterns (fraction of completions; rules in sage_unsloth/report/patterns.py)"]
    if result.patterns.empty:
        where = f"glob `{args.completions}`" if args.completions else "default locations"
        return [*parts, f"No completion files found ({where})."]
    if not result.patterns[list(pat.PATTERNS)].to_numpy().any():
        return [
            *parts,
            (
                f"No completion of the {int(result.patterns['n_completions'].sum())} read matches any pattern's "
                f"rule, so the table is left out (`{Path(result.out).stem}/patterns.csv` has the zeros)."
            ),
        ]
    rows = []
    for _, r in result.patterns.iterrows():
        row = map_run(r["model"], r["run"], mapping)
        cells = [f"{r['model']}/{r['run']}", int(r["n_completions"])]
        for name in pat.PATTERNS:
            paper = published_patterns[
                (published_patterns["pattern"] == name)
                & (published_patterns["method"] == row.method)
                & (published_patterns["model"] == row.model)
            ]
            paper_txt = (
                f" (paper {paper_number(paper['value'].iloc[0], paper['primary'].iloc[0])})"
                if not paper.empty
                else ""
            )
            cells.append(formatting.number(r[name]) + paper_txt)
        rows.append(cells)
    return [
        *parts,
        md_table(["run", "completions", *pat.PATTERNS], rows),
        (
            "The paper's values (in parentheses) are context, not a like-for-like target (its labelling method "
            f"is unknown); compare runs with each other. {UNTRACED_LEGEND}."
        ),
    ]


def print_console(comparison: pd.DataFrame) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="SAGE report: runs vs paper (Δ = run − paper)")
    for col in ("run", "dataset", "metric", "k", "value", "95% CI", "paper", "Δ"):
        table.add_column(col)
    for _, r in comparison.iterrows():
        table.add_row(
            f"{r['model']}/{r['run']}",
            r["dataset"],
            r["metric"],
            "" if pd.isna(r["k"]) else str(int(r["k"])),
            formatting.number(r["value"]),
            formatting.interval(r["ci_low"], r["ci_high"]),
            _paper_cell(r),
            formatting.number(r["diff"], signed=True, empty=""),
        )
    Console(width=140).print(table)


# ---------------------------------------------------------------- pipeline
def read_from_wandb(args: ReportArguments, api=None) -> ReportArguments:
    """``--from_wandb``: the evaluations the W&B runs hold, written as results folders under ``<results>/wandb/``
    (locked while written; sage_unsloth/report/wandb_read.py); returns ``args`` reading that folder. ``api``: a
    stand-in for ``wandb.Api()`` (tests)."""
    from sage_unsloth.report.wandb_read import read_wandb
    from sage_unsloth.runtime.folder_lock import FolderLock
    from sage_unsloth.runtime.wandb_runs import import_wandb

    import_wandb("--from_wandb")  # both sources need it (the offline files are read with its own reader)
    into = Path(args.results) / WANDB_RESULTS
    with FolderLock(into, fix="pass another --results"):
        names = read_wandb(args.from_wandb, args.wandb_group, into, api=api)
    log.info("read %d evaluation(s) from W&B %s into %s", len(names), args.from_wandb, into)
    return dataclasses.replace(args, results=str(into))


def build_report(args: ReportArguments, *, console: bool = True, api=None) -> ReportResult:
    """Write the report; its folder (``<out without .md>/``, which also covers ``out``) is locked while it is
    written (sage_unsloth/runtime/folder_lock.py): a second report into the same place stops in one line. With
    ``--from_wandb`` the results are first read from W&B (:func:`read_from_wandb`; ``api``: its stand-in)."""
    from sage_unsloth.runtime.folder_lock import FolderLock

    args.validate()
    if args.from_wandb:
        args = read_from_wandb(args, api=api)
    if not Path(args.results).is_dir():
        discover_runs(
            args.results
        )  # its one line; nothing is created beside a results folder that is not there
    out = Path(args.out) if args.out else Path(args.results) / "report.md"
    with FolderLock(
        out.with_suffix(""), fix="pass another --out"
    ):  # a report that writes nothing leaves none
        return _build_report(args, out, console=console)


def _build_report(args: ReportArguments, out: Path, *, console: bool) -> ReportResult:
    results = Path(args.results)
    assets = out.with_suffix("")
    mapping = load_mapping(args.mapping)
    paper_dir = args.paper_dir or (
        results / "paper" if (results / "paper" / "published_passk.csv").is_file() else None
    )
    published, published_patterns = load_published(paper_dir)
    runs = discover_runs(results)
    if not runs:
        raise FileNotFoundError(
            f"no results/<model>/<run>/passk.csv under {results}: run the eval stage first"
        )
    settings = tables.BootstrapSettings(resamples=args.resamples, seed=args.seed, level=args.level)
    curves = tables.curve_table(runs, settings)
    comparison = tables.comparison_table(runs, curves, published, mapping)
    pairs = tables.paired_table(
        tables.resolve_pairs(runs, args.pairs, mapping), runs, published, settings, mapping
    )
    seeds = multi_seed.multi_seed_tables(runs, args.pairs, settings, mapping)
    patterns = pat.pattern_table(runs, args.completions, samples_per_problem=args.pattern_samples_per_problem)
    size = (args.plot_width, args.plot_height)
    colours = grouping.palette(f"{r.model}/{grouping.method_of(r.run)}" for r in runs)  # one per method
    images = plots.passk_curves(curves, comparison, assets, size=size, colours=colours)
    rel = lambda p: Path(p).resolve().relative_to(out.parent.resolve()).as_posix()
    support_frame, support_md = _support_section(args, runs, mapping, settings, (assets, size, colours, rel))
    training_frame, training_md, training_png = _training_section(args, runs, assets, size, colours, rel)
    result = ReportResult(
        markdown="",
        comparison=comparison,
        curves=curves,
        pairs=pairs,
        patterns=patterns,
        images=images,
        out=out,
        support=support_frame,
        training=training_frame,
        seeds=seeds,
    )
    result.markdown = render_markdown(args, runs, result, published_patterns, mapping)
    result.markdown += "\n" + support_md + "\n" + "\n" + training_md + "\n"
    _write_report_files(args, runs, result, assets)
    if console:
        print_console(comparison)
    if args.wandb_project:
        _log_to_wandb(args, result, training_png, (published, published_patterns, mapping))
    log.info("wrote %s (tables and plots in %s/)", out, assets)
    return result


def _support_section(args: ReportArguments, runs, mapping, settings: tables.BootstrapSettings, drawing):
    """(the support table, its markdown section with the plots it drew; ``drawing``: (assets folder, size,
    colours, the relative-path function))."""
    assets, size, colours, rel = drawing
    notes: list[str] = []
    frame = support.support_table(
        runs, reference=args.support_reference, mapping=mapping, notes=notes, **dataclasses.asdict(settings)
    )
    images = support.plot_support(frame, assets, size=size, colours=colours)
    return frame, support.markdown_section(frame, images, rel, notes)


def _training_section(args: ReportArguments, runs, assets: Path, size, colours, rel):
    """(the training summary table, its markdown section, the training-curves plot or None)."""
    notes: list[str] = []
    histories = training.load_histories(training.training_folders(runs, args.training_runs), notes)
    png = plots.training_curves(
        histories, training.metric_keys(histories), assets / "training_curves.png", size=size, colours=colours
    )
    frame = training.summary_table(histories)
    section = training.markdown_section(
        frame, rel(png) if png else None, f"{assets.name}/training.csv", notes
    )
    return frame, section, png


def _write_report_files(args: ReportArguments, runs, result: ReportResult, assets: Path) -> None:
    """The tables as CSVs and the manifest under ``assets``, then the report itself (each write atomic)."""
    for name, frame in (
        ("comparison", result.comparison),
        ("passk_all_k", result.curves),
        ("pairs", result.pairs),
        ("patterns", result.patterns),
        ("support", result.support),
        ("training", result.training),
        *result.seeds.items(),
    ):
        atomic_write_text(assets / f"{name}.csv", frame.to_csv(index=False))
    write_manifest(
        assets, stage="report", config=dataclasses.asdict(args), seed=args.seed, runs=[r.name for r in runs]
    )
    atomic_write_text(result.out, result.markdown)


def _log_to_wandb(args: ReportArguments, result: ReportResult, training_png: Path | None, paper) -> None:
    """The report's tables and plots, the paper's tables and the runs beside the paper's rows (``paper``: the
    published pass@k and pattern tables and the run mapping) to a W&B run of the report's own."""
    from sage_unsloth.report import wandb_log

    published, published_patterns, mapping = paper
    all_images = dict(result.images)
    if training_png is not None:
        all_images["training_curves"] = training_png
    wandb_log.log_report(
        args.wandb_project,
        entity=args.wandb_entity,
        group=args.wandb_group,
        markdown=result.markdown,
        tables={
            "comparison": result.comparison,
            "passk_all_k": result.curves,
            "pairs": result.pairs,
            "patterns": result.patterns,
            "training": result.training,
            "runs_vs_paper": wandb_log.runs_vs_paper(result.curves, published, mapping),
        },
        paper={"passk": published, "reasoning_patterns": published_patterns},
        images=all_images,
    )
