"""Targets that changed after they were built: doit only checks that targets exist.

`targets_unchanged()` is a doit uptodate item. When its task succeeds it records each target's
[size, mtime_ns, ctime_ns, inode, recorded_ns, XXH3-128] (through the shared digest cache: the bytes were usually just
hashed as another task's file_dep, so nothing is read twice). On later runs the task is out of
date when a target's digest no longer matches, with a line naming the file:

    hexbundle: build/qwen2-tiny/iq9075/four/reference/bin/qwen2_tiny_part_2_of_4.bin changed
    since compile:part_2_of_4 built it: rebuilding

The stat key is the fast path: an unchanged file costs one stat. A hand edit changes the
ctime, even when the mtime is put back (`touch -r`, `cp -p`), or the inode, for an editor that
writes a new file, so it is hashed and compared; so is a file recorded in its own timestamp
tick (hashing.racy: a second write in that tick would leave the stat as it was). The
bundle's bins are hard links to bin/ (one inode): an edit through either name shows under
both, and the digest cache finds the digest under the other name instead of hashing again.
"""
from __future__ import annotations

import os

from hexbundle.config.layout import Layout
from hexbundle.support import console, hashing

KEY = "_targets_xxh3"


def record(targets) -> dict:
    """{target: hashing.file_state()} for the targets that exist."""
    out = {}
    for target in sorted(targets):
        try:
            out[target] = hashing.file_state(target)
        except FileNotFoundError:
            continue   # doit sees a missing target by itself on the next run
    return out


def changed(target: str, state) -> bool:
    """True if the target's bytes differ from the recorded state (or it cannot be read)."""
    try:
        st = os.stat(target)
    except OSError:
        return True
    return hashing.state_changed(target, st, state)


class targets_unchanged:
    """doit uptodate item: False when a target differs from what the task last wrote."""

    def configure_task(self, task) -> None:
        task.value_savers.append(lambda: {KEY: record(task.targets)})

    def __call__(self, task, values) -> bool:
        recorded = values.get(KEY)
        if not isinstance(recorded, dict):
            return False   # never recorded (built by an older hexbundle): build once more
        up_to_date = True
        for target in task.targets:
            if not os.path.exists(target) or target not in recorded:
                up_to_date = False   # doit rebuilds missing targets; a new target: build once
            elif changed(target, recorded.get(target)):
                console.say(f"hexbundle: {target} changed since {task.name} built it: rebuilding")
                up_to_date = False
        return up_to_date

    def __repr__(self) -> str:
        return "targets_unchanged()"


# ---------------------------------------------------------------------------------------------
# the bundle directory as the bundle step (steps/bundle.py) makes it

def bundle_drift(layout: Layout) -> list:
    """Why the bundle directory is not what the bundle step makes, though every target is
    unchanged: files it does not list (a bundle holds only its own files), and bins that are
    no longer hard links to bin/ (compile replaced bin/X.bin with a new file of the same bytes,
    and the bundle's name still points at the old one). Empty when it is in place."""
    bundle = layout.bundle_dir
    if not bundle.is_dir():
        return []
    # top-level names: the runtime's lib/, dsp/, bin/ are folders
    wanted = {p.relative_to(bundle).parts[0] for p in layout.bundle_files()}
    notes = [f"{layout.rel(bundle / n)} is not part of the bundle: removing it"
             for n in sorted(os.listdir(bundle)) if n not in wanted]
    for part in layout.cfg.plan.parts():
        shipped, built = bundle / layout.bin_name(part), layout.bin(part)
        try:
            a, b = os.stat(shipped), os.stat(built)
        except OSError:
            continue   # missing: doit rebuilds a missing target by itself
        if a.st_dev == b.st_dev and a.st_ino != b.st_ino:   # across filesystems it is a copy
            notes.append(f"{layout.rel(shipped)} is no longer a hard link to "
                         f"{layout.rel(built)}: linking it again")
    return notes


class bundle_in_place:
    """doit uptodate item of `bundle`: False (with a line saying why) when bundle_drift finds
    anything, so the step assembles the bundle again (whole, unlisted files gone, bins linked)."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def __call__(self, task, values) -> bool:
        notes = bundle_drift(self.layout)
        for note in notes:
            console.say(f"hexbundle: {note}")   # hidden at -v 0, on stderr under -r json
        return not notes

    def __repr__(self) -> str:
        return "bundle_in_place()"


# ---------------------------------------------------------------------------------------------
# outputs no task makes any more (ninja's `-t cleandead`)

def dead_outputs(layout: Layout) -> list:
    """The DLCs and bins in the variant's dlc/ and bin/ that no convert or compile of the
    current configuration makes: left by a setting that renamed them (the model's slug, its
    graphs' AR or context length). A clean build has none, so an incremental one must not."""
    live = {layout.bin(part) for part in layout.cfg.plan.parts()}
    live |= {layout.dlc(g) for part in layout.cfg.plan.parts()
             for g in layout.cfg.model.graphs(part)}
    dead = []
    for directory, suffix in ((layout.dlc_dir, ".dlc"), (layout.bin_dir, ".bin")):
        if directory.is_dir():
            dead += [p for p in sorted(directory.iterdir())
                     if p.suffix == suffix and p.is_file() and p not in live]
    return dead


def remove_dead_outputs(layout: Layout) -> None:
    """Remove dead_outputs, each named: the bundle step runs after every convert and compile."""
    for path in dead_outputs(layout):
        console.say(f"hexbundle: {layout.rel(path)} is made by no step of this configuration "
                    "any more: removing it")
        path.unlink()


def record_build_info(layout: Layout) -> None:
    """After the bundle step: build-info.json, how the bundle was built (the executor, the
    toolchain image, where each step's outputs came from: formats.origins). Here, in the doit
    run, not in the step: the origin records are no input of the step."""
    from hexbundle.formats.manifest import write_build_info
    from hexbundle.formats.origins import read_origins
    from hexbundle.graph.keys import image_id
    image = (image_id(layout.root) or "") if layout.cfg.executor == "docker" else ""
    write_build_info(layout.build_info, layout.cfg.executor, image, read_origins(layout.records))
