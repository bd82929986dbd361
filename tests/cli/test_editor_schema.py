"""The editors' JSON Schemas (configs/schemas/<stage>.schema.json, sage_unsloth/config/editor_schema.py): generated from the
kit's schema and up to date, valid draft 2020-12, mapped to every stage config by .vscode/settings.json, and every
stage config under configs/ validates against its stage's schema with a JSON Schema validator (jsonschema); bad
values the kit's own check refuses are refused by the schema too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from test_configs import ALL_YAMLS, _stage_of

from sage_unsloth.config import editor_schema
from sage_unsloth.config.schema import check_stage_input

REPO = Path(__file__).resolve().parents[2]
SETTINGS = REPO / ".vscode" / "settings.json"
STAGE_YAMLS = [p for p in ALL_YAMLS if _stage_of(p) in editor_schema.editor_schemas()]  # not accelerate's


def _schema(stage: str) -> dict:
    return json.loads((editor_schema.OUT_DIR / f"{stage}.schema.json").read_text())


def _errors(stage: str, config: dict) -> list[str]:
    validator = Draft202012Validator(_schema(stage))
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<file>'}: {e.message}"
        for e in validator.iter_errors(config)
    ]


def test_the_committed_schemas_are_generated_from_the_kits_schema():
    schemas = editor_schema.editor_schemas()
    assert sorted(p.name for p in editor_schema.OUT_DIR.glob("*.json")) == sorted(
        f"{s}.schema.json" for s in schemas
    )
    for stage, schema in schemas.items():
        committed = (editor_schema.OUT_DIR / f"{stage}.schema.json").read_text()
        assert committed == editor_schema.render(schema), (
            f"run python -m sage_unsloth.config.editor_schema --write ({stage})"
        )
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_editor_settings_map_each_stage_config_to_its_schema():
    mapping = json.loads(SETTINGS.read_text())["yaml.schemas"]
    schema_of: dict[str, list[str]] = {}
    for schema, patterns in mapping.items():
        for pattern in patterns:
            for path in REPO.glob(pattern):
                schema_of.setdefault(path.relative_to(REPO).as_posix(), []).append(Path(schema).name)
    for relative in STAGE_YAMLS:
        assert schema_of.get(relative) == [f"{_stage_of(relative)}.schema.json"], relative
    assert len(STAGE_YAMLS) >= 50


@pytest.mark.parametrize("relative", STAGE_YAMLS)
def test_every_stage_config_validates_against_its_json_schema(relative):
    config = yaml.safe_load((REPO / relative).read_text()) or {}
    assert _errors(_stage_of(relative), config) == [], relative


KIT_ONLY = "kit only"  # the kit refuses it in its first round (it looks at files); a JSON Schema cannot
BAD = [
    ("rlvr", {"sage_gama": 0.8}, "sage_gama"),  # unknown key
    ("rlvr", {"sage_gamma": 0.8}, "sage_gamma"),  # a retired key (now the guide node's argument gamma)
    ("rlvr", {"beta": -1}, "beta"),  # below its interval
    ("rlvr", {"guide": "brunch"}, "guide"),  # not a name, not a plug-in
    ("rlvr", {"guide": {"name": "brunch", "gamma": 0.8}}, "guide"),  # a node's name: the same
    ("rlvr", {"guide": {"name": "branch", "gamma": 0.8, "tau": 0.5}}, None),  # the node spelling
    ("rlvr", {"kl_term": '{"name": "k2"}'}, None),  # a node as its JSON text, as on the command line
    (
        "rlvr",
        {"guide": "my guide.py:fn"},
        KIT_ONLY,
    ),  # a plug-in file that is not there: no schema sees files
    ("rlvr", {"guide": {"name": "my guide.py:fn", "gamma": 0.8}}, KIT_ONLY),  # nor inside a node
    ("rlvr", {"guide": "pkg.mod:"}, "guide"),  # plug-in syntax
    ("rlvr", {"max_steps": "ten"}, "max_steps"),  # not an integer
    ("rlvr", {"learning_rate": "1e-5", "bf16": "true"}, None),  # text TRL's parser reads as a number, a bool
    ("eval", {"ks": "1, 8", "backend": "hf"}, None),  # a numeric list as text
    ("eval", {"ks": [0]}, "ks"),  # an item below 1
    ("eval", {"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ("report", {"resamples": 50}, "resamples"),
    ("sweep", {"jobs": 2, "configs": ["a.yaml"]}, None),
]


@pytest.mark.parametrize("stage, config, field", BAD)
def test_the_schema_refuses_what_the_kits_check_refuses(tmp_path, stage, config, field):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    kit = check_stage_input(stage, [str(path)])
    errors = _errors(stage, config)
    if field is None:
        assert kit == [] and errors == [], (kit, errors)
    elif field == KIT_ONLY:
        assert len(kit) == 1 and errors == [], (kit, errors)
    else:
        assert len(kit) == 1 and field in kit[0], kit
        assert errors and all(e.startswith(field) or field in e for e in errors), errors


def test_node_fields_are_objects_or_their_bare_name():
    """A plug-in field that is a node (``guide: {name: branch, gamma: 0.8}``) is checked key by key."""
    record = {
        "type": "dict",
        "names": ["none", "branch"],
        "plugins": True,
        "fields": {"gamma": {"type": "float", "limit": {"ge": 0}}, "tau": {"type": "float", "none_ok": True}},
    }
    schema = editor_schema.stage_json_schema("rlvr", {"guide": record})
    validator = Draft202012Validator(schema)
    for good in ("branch", {"name": "branch", "gamma": 0.8}, {"name": "pkg.guides:mine", "tau": None}):
        assert list(validator.iter_errors({"guide": good})) == [], good
    for bad in ("brunch", {"name": "branch", "gamma": -1}, {"name": "branch", "gama": 1}, {"gamma": 1}):
        assert list(validator.iter_errors({"guide": bad})), bad
