"""Variants side by side: each (model, device, plan, backend) keeps its own build state.

doit keeps one record per task name, and the names (`convert:part_1_of_4_prompt`,
`compile:part_2_of_4`) say nothing of the model, device, plan or backend. With one DB per build
root, a build of model B replaced the records of model A, and going back to A rebuilt all of it:
18 of 18 steps for qwen2-tiny, its inputs regenerated; 13 of 18 after switching the device.

So each variant has a dependency DB of its own -- the run's `dep_file`, chosen from the resolved
config (config.layout: `.hexbundle/db/<model>/<device>/<plan>/<backend>/doit-db.json`) -- and a
directory of its own (`<model>/<device>/<plan>/<backend>/`): nothing one variant writes is
another's, so switching back to a variant finds its records and its files as it left them.

The model's own steps are the exception: `inputs:*` write `<model>/inputs/`, which every variant
of the model reads. Their records are the model's, kept in `.hexbundle/db/<model>/doit-db.json`:
before doit opens the variant's DB, the run copies them in (`seeded`, by runguard under the build
lock), and a save of the DB that changed them writes them back there (`split_records`,
graph.db.DurableJsonDB.save). The variant's file keeps its copy, which the model's DB overrides.
doit decides about them exactly as before -- the generator's options, the split's file_dep --
but on the model's last word: a second device of a generated model finds its inputs up to date
and leaves their bytes alone, and when one variant regenerates them (another plan with the same
number of parts writes the same file names), the others see it and regenerate in turn, never
reading inputs recorded for another plan as their own. The build lock serialises runs in a build
root, so two variants never write the model's inputs or its DB at once.

Why not variant-qualified task names in one DB (the other way to keep variants apart): the
names are the interface -- `doit compile:part_2_of_4`, the messages that name a step ("changed
since compile:part_2_of_4 built it"), the README and the tests quote them --, one file would hold
every variant ever built and be rewritten whole after every step, and the inputs steps would
still need model-level names of their own. A DB per variant keeps the names and doit's behaviour
within a DB as they were; the one addition is the model's records kept apart, here.
"""
from __future__ import annotations

MODEL_STEP = "inputs"   # dodo.py's task_inputs: the steps that write the model's own files


def is_model_step(task_name: str) -> bool:
    """True for a task whose outputs are the model's (shared by its variants): `inputs:*`."""
    return task_name == MODEL_STEP or task_name.startswith(MODEL_STEP + ":")


def split_records(records: dict) -> tuple:
    """(the model's steps' records, the variant's own records) of one run's DB."""
    model = {k: v for k, v in records.items() if is_model_step(k)}
    own = {k: v for k, v in records.items() if not is_model_step(k)}
    return model, own


def seeded(variant_records: dict, model_records: dict) -> dict:
    """The variant's DB as doit must read it: its own records and the model's steps' records
    from the model's DB. A model step's record in the variant's file (left by a run killed before
    its first save) is a stale copy: the model's DB replaces it, or it is dropped."""
    _, own = split_records(variant_records)
    model, _ = split_records(model_records)
    return {**own, **model}
