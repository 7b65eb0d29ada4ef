"""The dependency DB's state before doit opens it: the model's steps' records seeded into the
variant's DB (graph.variants says why), for a run on disk, for a dry run in memory only.

Each variant has a DB of its own, and the model's own steps (inputs) keep their records in the
model's DB: copied into the variant's here, before doit opens it, written back by a save that
changed them (graph.db).
"""
from __future__ import annotations

import json
from pathlib import Path

from hexbundle.config.layout import DOIT_DB
from hexbundle.graph.db import pair_with_model, save_file
from hexbundle.graph.variants import seeded, split_records
from hexbundle.support.files import LinkedStateError
from hexbundle.support.jsondoc import read_state_json


def seed_variant_db(variant_db: Path, model_db: Path) -> None:
    """Give doit the model's steps' records in the variant's DB before it opens it (graph.variants):
    a variant built for the first time finds the model's inputs up to date. The variant's file
    keeps a copy of them, so it is rewritten only when another variant changed them. Both files
    were checked by set_aside_damaged_db just before."""
    model, variant = _read_db(model_db), _read_db(variant_db)
    records = seeded(variant, model)
    if records != variant:
        save_file(variant_db, lambda: json.dumps(records))
    pair_with_model(variant_db, model_db, split_records(model)[0])


def seeded_view(backend, layout, db_name: str = DOIT_DB) -> None:
    """The seeding of seed_variant_db, in memory only (doit's DB backend, through its set and
    remove): what `doit --dry-run` reads, writing nothing."""
    variant = _read_db(layout.doit_db(db_name))
    records = seeded(variant, _read_db(layout.model_db(db_name)))
    for task in set(variant) - set(records):
        backend.remove(task)
    for task, record in records.items():
        for key, value in record.items():
            backend.set(task, key, value)


def _read_db(db: Path) -> dict:
    """A DB's records; {} if there is none, or if it is a symbolic link (never read: a run sets
    it aside first; `doit --dry-run` takes it as empty)."""
    try:
        return read_state_json(db)
    except (FileNotFoundError, LinkedStateError):
        return {}


