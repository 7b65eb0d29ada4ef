"""doit's console reporter, plus the banner: what is built, with which backend, executor, device."""
from __future__ import annotations

from doit.reporter import ConsoleReporter

from hexbundle import __version__
from hexbundle.backends import describe
from hexbundle.config.layout import Layout
from hexbundle.graph import runguard
from hexbundle.support import console

_banner = ""


def set_banner(layout: Layout) -> None:
    global _banner
    _banner = banner(layout)


def banner(layout: Layout) -> str:
    cfg = layout.cfg
    version, deployable = describe(cfg.backend)
    note = "" if deployable else "  [reference backend: open formats, NOT deployable]"
    return (f"hexbundle {__version__}: {cfg.model.name}, plan {cfg.plan.name} "
            f"({len(cfg.plan.layers_per_part)} parts) for {cfg.device.banner()}\n  backend "
            f"{cfg.backend} ({version}), executor {cfg.executor}, weights_packing "
            f"{cfg.compile['weights_packing']}, weight_sharing "
            f"{cfg.compile['weight_sharing']}{note}\n  convert: float_precision "
            f"{cfg.compile['float_bitwidth']}, truncate_64bit_io "
            f"{cfg.compile['truncate_64bit_io']}, quantize_io {cfg.compile['quantize_io']}, "
            f"quantize_full_type {cfg.compile['quantize_full_type'] or '(not passed)'}\n  output: "
            f"{layout.rel(layout.build_dir)}")


class Reporter(ConsoleReporter):
    """doit's console reporter, plus the banner saying what is built and how, first thing."""

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        if _banner and not console.quiet():   # -v 0 / -v 1: task output is not shown
            self.outstream.write(_banner + "\n")

    def add_success(self, task):
        super().add_success(task)
        runguard.save_progress()   # a run killed later keeps this task's record
