"""Loads the tasks' items from the JSON Lines files beside this file (no download)."""
import json
import os

import datasets


def _split(name: str, **_) -> datasets.DatasetDict:
    path = os.path.join(os.path.dirname(__file__), name)
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def load_multiple_choice(**options) -> datasets.DatasetDict:
    return _split("parashift_mc.jsonl", **options)


def load_generate(**options) -> datasets.DatasetDict:
    return _split("parashift_gen.jsonl", **options)
