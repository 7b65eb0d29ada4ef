"""What makes a `doit` run safe to kill, to interrupt and to start twice: the order of the
three guards, started by the command that writes, never at `import dodo`.

graph.loader starts guard_run after dodo.py is read and before doit opens the dependency DB,
for every command but those that read only (graph.commands: `doit list`, `help`, `info`,
`dumpdb`, `tabcompletion`, a dry run, `doit TASK --help`, `doit check_bundle`, `doit verify
--json`): those take no lock and write nothing, so they answer while a build runs.

1. the lock (graph.lock);
2. recovery after a killed run, an older hexbundle or a hand edit (graph.recovery): only under
   the lock, so a live run's temp files and containers are never touched;
3. the DB state (graph.dbstate): the model's records seeded into the variant's DB. The DB
   itself is hexbundle's doit backend (graph.db): written atomically, after every task.
Ctrl-C and SIGTERM end the run with one line (graph.interrupts).
"""
from __future__ import annotations

from hexbundle.config.layout import DOIT_DB
from hexbundle.graph import dbstate, interrupts, lock, recovery


def guard_run(layout, db_name: str = DOIT_DB) -> None:
    """The lock, recovery and DB state, in this order, for this doit process. `db_name`: the
    DB file of the run's checker (doit-db-md5.json for `doit bench`'s baseline)."""
    root, build = layout.root, layout.build_root
    interrupts.report_interrupts_cleanly()   # first: Ctrl-C while waiting for the lock is clean
    recovery.check_state_shapes(layout)
    owned = recovery.claim_build_root(layout)   # before the lock creates .hexbundle/ in it
    lock.hold_lock(layout.lock, root)
    recovery.remove_leftover_containers(layout)   # first: nothing of the killed run writes now
    if owned:
        recovery.restore_interrupted_swaps(build, root)
        recovery.sweep_temp_files(build, root)
    else:
        recovery.notice(
            f"{build} is not a build root hexbundle made (it held other files when first used, "
            f"and no {recovery.rel(layout.root_marker, root)} written for it): nothing in it is "
            "cleaned up after an interrupted run; use a new or empty directory as the build root")
    recovery.set_aside_former_db(layout.former_doit_db, root)
    variant_db, model_db = layout.doit_db(db_name), layout.model_db(db_name)
    recovery.set_aside_damaged_db(model_db, root)
    recovery.set_aside_damaged_db(variant_db, root)
    dbstate.seed_variant_db(variant_db, model_db)
    bundle = getattr(layout, "bundle_dir", None)
    if bundle is not None:
        recovery.set_aside_bundle_link(bundle, root)
        recovery.refuse_linked_output_dirs(layout)
