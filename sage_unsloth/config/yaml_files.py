"""A config file read as YAML the way the kit reads every stage, sweep and lab config: bounded, and strict about
what YAML lets through in silence.

- **Size**: a file over :data:`MAX_CONFIG_BYTES` is refused before it is read (a config is keys and values; data
  goes in a data file), so a 50 MB file costs a ``stat``, not minutes of parsing.
- **Aliases**: ``&anchor`` / ``*alias`` are allowed, but the document they expand to is counted before anything is
  built from it (each alias counted at each use): more than :data:`MAX_VALUES` values is refused, so an alias
  bomb (a list of lists of the same list, nine deep) is one line instead of a hang or a MemoryError in whatever
  walks the value later (the type checks, a repr, a manifest's JSON). An alias that contains itself is refused too.
- **Duplicate keys**: a key set twice in one mapping is refused naming both lines (YAML keeps the last one in
  silence; ``<<`` merge keys are overridden by design and are not duplicates).

:func:`key_spelling` finds how a key's value is written in a file of a ``base:`` chain (the pre-import check names
``guide: no``, which YAML 1.1 reads as the boolean False, by its own spelling and line). Stdlib and PyYAML
only.
"""

from __future__ import annotations

from pathlib import Path

import yaml

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB; the kit's largest config is a few KB
MAX_VALUES = (
    100_000  # values of the expanded document (every scalar, list and mapping, aliases counted per use)
)
MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlProblem(ValueError):
    """A config file YAML would read, refused for its size, its aliases or its duplicate keys (one line)."""


def read_yaml(path: Path):
    """The document of the YAML file at ``path``, read with the bounds above; yaml.YAMLError for bad syntax,
    YamlProblem for the rest, OSError / UnicodeDecodeError from reading."""
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise YamlProblem(
            f"{path} is {size / 2**20:.1f} MiB: a config is at most {MAX_CONFIG_BYTES // 2**20} MiB of keys and "
            "values (rows go in a data file: dataset_path)"
        )
    loader = _BoundedLoader(path.read_text(encoding="utf-8"))
    loader.config_path = path
    try:
        return loader.get_single_data()
    except RecursionError:
        raise YamlProblem(f"{path} nests lists or mappings deeper than a config can: flatten it") from None
    finally:
        loader.dispose()


def key_spelling(files, key: str) -> tuple[Path, int, str] | None:
    """(file, 1-based line, the value as written) of top-level ``key`` in the first of ``files`` (a ``base:`` chain,
    the config itself first) that sets it with a plain scalar; None where none does."""
    for file in files:
        try:
            loader = _BoundedLoader(Path(file).read_text(encoding="utf-8"))
            try:
                root = loader.get_single_node()
            finally:
                loader.dispose()
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
            continue
        if not isinstance(root, yaml.MappingNode):
            continue
        for key_node, value_node in root.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                if isinstance(value_node, yaml.ScalarNode):
                    return Path(file), key_node.start_mark.line + 1, value_node.value
                return None
    return None


class _BoundedLoader(yaml.SafeLoader):
    config_path: Path | None = None

    def construct_document(self, node):
        _check_expansion(node, self.config_path)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self._check_duplicates(node)
        return super().construct_mapping(node, deep=deep)

    def _check_duplicates(self, node) -> None:
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            try:
                key = self.construct_object(key_node)
                hash(key)
            except (yaml.YAMLError, TypeError):
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                raise YamlProblem(
                    f"{self.config_path}: key {key!r} is set twice, on line {seen[key]} and line {line}: keep one "
                    "(YAML would keep the last in silence)"
                )
            seen[key] = line


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root, path: Path | None) -> None:
    """Refuse a document that expands to more than MAX_VALUES values, or whose aliases contain themselves. The
    node graph shares an aliased node, so each node's expanded size is computed once (post-order, no recursion)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > MAX_VALUES:
                line = node.start_mark.line + 1
                raise YamlProblem(
                    f"{path}: the value at line {line} expands to more than {MAX_VALUES:,} values (its aliases, "
                    "*name, repeat what they name): write the values out, or use fewer aliases"
                )
            continue
        if key in sizes:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise YamlProblem(
                    f"{path}: the alias at line {child.start_mark.line + 1} contains itself: a config value must "
                    "be finite"
                )
            if id(child) not in sizes:
                stack.append((child, False))
