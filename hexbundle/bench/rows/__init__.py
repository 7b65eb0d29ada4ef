"""The rows of `doit bench`, one unit each (rows 7 and 8 share one measurement): a module with
IDS (its row numbers), NEEDS_BUILD (whether it measures against the full build),
measure(bench, full) -> what it measured, and table(measured, bench, full) -> its table rows.
ROWS is the order they are measured in (the table is sorted by row number): remote execution
first (it compares its bundle with the local `-n 1` build's, still in place), the rows that
change the tree's inputs last. A new row: a module beside these and one entry here."""
from __future__ import annotations

from hexbundle.bench.rows import (backend, cache, change, checkpoint, digests, parallel,
                                  remote_exec, simulator, split, startup, touch, verify)

ROWS = (remote_exec, parallel, cache, verify, backend, simulator, digests, startup, touch, change,
        split, checkpoint)
ALL_ROWS = tuple(sorted(i for unit in ROWS for i in unit.IDS))
NEEDS_BUILD = {i for unit in ROWS if unit.NEEDS_BUILD for i in unit.IDS}
