#!/usr/bin/env python
"""Rewrites stage-2 configs from the flat spelling to one node per plug-in (docs/extending.md):

    sage_guide: branch                      guide: {name: branch, gamma: 0.8, tau: 0.5}
    sage_gamma: 0.8              ->
    sage_tau: 0.5
    kl_estimator: k2                        kl_term: k2
    advantage_estimator: passk              advantage_estimator: {name: passk, k: 4}
    passk_k: 4

and a sweep config's executor section (``slurm: {...}`` under ``executor: slurm``) to ``executor_settings: {...}``.

    python scripts/migrate_configs.py                # every YAML under configs/, examples/, tests/ and notebooks/
    python scripts/migrate_configs.py FILE ...       # these files (a lab method file of your own, say)
    python scripts/migrate_configs.py --check        # exit 1 naming each file (YAML, or a YAML key in a .md/.py
                                                     # file) still in the flat spelling

Idempotent: a file already in the node spelling is left as it is. A node replaces its base's node whole (the
loader merges top-level keys: sage_unsloth/config/args.py), so the node a file gets holds every argument its
old keys and its ``base:`` chain set that differs from the plug-in's default (the file's own keys are kept even
where they equal it); knobs the named plug-in does not take (a branch knob beside ``sage_guide: none``) are
dropped, as the flat spelling ignored them. Only the lines of the old keys change, so comments and the other
keys stay where they are; the result is read back and compared with the nodes computed, or the file is left
untouched and named. Markdown and Python files are only checked (``--check``): fix their inline configs by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GLOBS = ("configs/**/*.yaml", "examples/**/*.yaml", "tests/**/*.yaml", "notebooks/**/*.yaml")
# Where an inline config is checked (--check): not tests/, whose cases write the flat spelling on purpose.
TEXT_GLOBS = ("docs/**/*.md", "README.md", "examples/**/*.py", "notebooks/**/*.py")
SKIP = {"scripts/migrate_configs.py"}
TOP_KEY = re.compile(r"^([A-Za-z_][\w.-]*)\s*:")


def _kit():
    """(RETIRED_KEYS, node field -> registry): the kit's own facts (rlvr/config.py, rlvr/plan.py)."""
    from sage_unsloth.rlvr.config import RETIRED_KEYS
    from sage_unsloth.rlvr.plan import NODES

    return RETIRED_KEYS, NODES


def _own(path: Path) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    return data if isinstance(data, dict) else {}


def _chain(path: Path) -> list[Path]:
    """The file and its base: chain, the base first (a base that does not exist ends the chain)."""
    files, current = [], path
    while current.is_file() and current.resolve() not in {f.resolve() for f in files}:
        files.append(current)
        base = _own(current).get("base")
        if base is None:
            break
        current = _base(current, str(base))
    return files[::-1]


def _base(path: Path, base: str) -> Path:
    if base.startswith("demo:"):  # the lab's spelling for the kit's configs/demo/<file>
        return REPO / "configs" / "demo" / base.removeprefix("demo:")
    return path.parent / base


def _node_of(value) -> tuple[str, dict]:
    from sage_unsloth.config.field_rules import node_mapping

    node = node_mapping(value)
    return str(node.pop("name")), node


def states(path: Path) -> tuple[dict, dict]:
    """(node field -> [name, args, the args set by flat fields] effective at ``path``, node field -> the keys
    ``path`` itself sets)."""
    retired, nodes = _kit()
    state: dict = dict.fromkeys(nodes)
    own: dict[str, set] = {field: set() for field in nodes}
    for file in _chain(path):
        data, mine = _own(file), file == path
        for field in nodes:  # a node in the new spelling replaces the state whole
            if field in data:
                name, args = _node_of(data[field])
                state[field] = [name, dict(args), set()]
                if mine:
                    own[field] |= {"name", *args}
        for key, value in data.items():
            if key not in retired:
                continue
            field, arg, _ = retired[key]
            current = state[field] or [_default_name(field), {}, set()]
            if arg == "name":
                current[0] = str(value)
            elif arg is None:  # a whole <kind>_args mapping (or its JSON text)
                mapping = (json.loads(value) if value.strip() else {}) if isinstance(value, str) else value
                current[1].update(mapping or {})
                current[2] -= set(mapping or {})
            else:
                current[1][arg] = value
                current[2].add(arg)
            state[field] = current
            if mine:
                own[field] |= set(mapping or {}) if arg is None else {arg}
    return state, own


def _default_name(field: str) -> str:
    return {"guide": "none", "advantage_estimator": "grpo", "policy_term": "none", "kl_term": "k3"}[field]


def node_for(field: str, name: str, args: dict, flat: set, own: set) -> dict | str:
    """The node a file writes: the arguments the named plug-in takes (a built-in's by its signature; a plug-in by
    path's from its <kind>_args mapping, and the kit's own keys), the inherited ones only where they differ from
    the default."""
    if name == "none":  # no guide / no policy term: no arguments (q = 1 needs no clip range)
        return name
    _, nodes = _kit()
    registry = nodes[field]
    kit = {k: default for k, (default, _) in registry.kit_args.items()}
    if name in registry:
        entry = registry.resolve(name)
        defaults = {**registry._defaults(entry), **kit}
        takes = (registry._parameters(entry) or set()) | set(kit)
        trl = set(entry.meta.get("trl_fields") or ())
        kept = {k: v for k, v in args.items() if k in takes and k not in trl}
    else:  # the flat fields were a built-in's knobs, which a plug-in by path never read
        defaults = kit
        kept = {k: v for k, v in args.items() if k not in flat or k in kit}
    kept = {k: v for k, v in kept.items() if k in own or defaults.get(k, object()) != v}
    return {"name": name, **kept} if kept else name


def _flow(node) -> str:
    return (
        yaml.safe_dump(node, default_flow_style=True, width=10**6, sort_keys=False)
        .strip()
        .removesuffix("...")
        .strip()
    )


def _comment(line: str) -> str:
    """The trailing comment of a YAML line (`  # ...`), or ''; a '#' inside quotes is no comment."""
    body = line.split("\n")[0]
    at = re.search(r"\s#", body)
    if at is None or "'" in body[: at.start()] or '"' in body[: at.start()]:
        return ""
    return body[at.start() :].strip()


def rewrite(text: str, nodes: dict[str, dict | str], retired: dict) -> str:
    """``text`` with the top-level lines of the old keys (and of the nodes written) replaced by one line per node,
    at the place of the first of them; other lines unchanged."""
    lines = text.splitlines(keepends=True)
    blocks: list[tuple[int, int, str]] = []  # (first line, end line, key)
    for i, line in enumerate(lines):
        match = TOP_KEY.match(line)
        if match:
            end = i + 1
            while end < len(lines) and (lines[end][:1] in (" ", "\t") and lines[end].strip()):
                end += 1
            blocks.append((i, end, match[1]))
    field_of = {key: retired[key][0] for key in retired} | {field: field for field in nodes}
    out, placed, skip_to = [], set(), -1
    comments: dict[str, list[str]] = {}
    for first, end, key in blocks:
        if key in field_of and field_of[key] in nodes and (c := _comment(lines[first])):
            comments.setdefault(field_of[key], []).append(c.lstrip("# ").strip())
    by_line = {first: (end, key) for first, end, key in blocks}
    for i, line in enumerate(lines):
        if i < skip_to:
            continue
        if i in by_line and by_line[i][1] in field_of and field_of[by_line[i][1]] in nodes:
            end, key = by_line[i]
            field = field_of[key]
            skip_to = end
            if field not in placed:
                placed.add(field)
                note = "; ".join(comments.get(field, []))
                newline = "\n" if lines[end - 1].endswith("\n") else ""
                out.append(f"{field}: {_flow(nodes[field])}" + (f"  # {note}" if note else "") + newline)
            continue
        out.append(line)
    return "".join(out)


# A sweep config's executor sections of before (``slurm: {...}``, ``ray: {...}``): the chosen executor's becomes
# executor_settings, the other is kept as a comment.
EXECUTOR_SECTIONS = ("slurm", "ray")


def old_keys(data: dict) -> list[str]:
    retired, _ = _kit()
    sweep = [key for key in EXECUTOR_SECTIONS if key in data and "configs" in data]
    return [key for key in data if key in retired] + sweep


def migrate_sweep(path: Path, data: dict) -> str | None:
    """A sweep config's executor section to executor_settings (line by line, comments kept)."""
    present = [key for key in EXECUTOR_SECTIONS if key in data]
    if not present or "executor_settings" in data:
        return None
    chosen = data.get("executor") if data.get("executor") in present else present[0]
    lines, out, inside = path.read_text().splitlines(keepends=True), [], None
    for line in lines:
        match = TOP_KEY.match(line)
        if match:
            inside = match[1] if match[1] in present else None
        if inside == chosen and match:
            out.append("executor_settings" + line[len(chosen) :])
        elif inside is not None and inside != chosen:
            out.append(f"# (executor {inside}) {line}" if line.strip() else line)
        else:
            out.append(line)
    new_text = "".join(out)
    want = {k: v for k, v in data.items() if k not in present} | {"executor_settings": data[chosen]}
    if (yaml.safe_load(new_text) or {}) != want:
        return f"NOT rewritten (the line edit did not read back as {want}): edit it by hand"
    path.write_text(new_text)
    return f"rewritten: {chosen}: -> executor_settings:"


def migrate(path: Path) -> str | None:
    """Rewrite ``path`` in place when it holds old keys; returns what happened, or None when nothing did."""
    data = _own(path)
    if any(key in data for key in EXECUTOR_SECTIONS) and "configs" in data:  # a sweep config
        return migrate_sweep(path, data)
    found = old_keys(data)
    if not found:
        return None
    retired, _ = _kit()
    state, own = states(path)
    fields = {retired[key][0] for key in found}
    written = {f: node_for(f, *state[f], own[f]) for f in sorted(fields)}
    new_text = rewrite(path.read_text(), written, retired)
    want = {k: v for k, v in data.items() if k not in retired} | written
    if (yaml.safe_load(new_text) or {}) != want:
        return f"NOT rewritten (the line edit did not read back as {want}): edit it by hand"
    path.write_text(new_text)
    return "rewritten: " + ", ".join(f"{f}: {_flow(n)}" for f, n in written.items())


def stale_text_lines(path: Path) -> list[str]:
    """Lines of a .md / .py file that write an old key as a YAML key (``  sage_gamma: 0.8``) or a flag."""
    retired, _ = _kit()
    pattern = re.compile(r"(^|[\s{,'\"])(--)?(" + "|".join(map(re.escape, retired)) + r")(:\s|\s*=|\s+\S)")
    return [
        f"{path}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and "retired" not in line
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "files", nargs="*", help="YAML configs (default: every one under configs/, examples/, ...)"
    )
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 naming what is still flat"
    )
    args = parser.parse_args(argv)
    files = [Path(f) for f in args.files] or sorted({p for g in GLOBS for p in REPO.glob(g)})
    stale = []
    for path in files:
        if args.check:
            if old_keys(_own(path)):
                stale.append(f"{path}: {', '.join(old_keys(_own(path)))}")
            continue
        if (what := migrate(path)) is not None:
            print(f"{path}: {what}")
            if what.startswith("NOT"):
                stale.append(str(path))
    if args.check and not args.files:
        texts = sorted({p for g in TEXT_GLOBS for p in REPO.glob(g)} - {REPO / s for s in SKIP})
        stale += [line for path in texts for line in stale_text_lines(path)]
    for line in stale if args.check else ():
        print(line)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
