"""What a run is asked: each stage's parser over its config classes (args.py), the check of every input before
TRL is imported (schema.py, stage_schema.json, field_rules.py), bounded YAML reading (yaml_files.py), the
editors' JSON Schemas (editor_schema.py), input files and folders (input_checks.py), the dry run, the training
stages' command line and the lab's method cards.
"""
