"""hexbundle task graph: ONNX -> DLC -> context binary -> Genie bundle.

Run `doit list` for the manual, `doit bundle` to build, `doit check_sizes` to re-check sizes.
Settings come from configs/build.toml; override them as `doit bundle model=... device=...`.
This file declares what each task reads, writes and which function does it; the work lives in
the hexbundle package.
"""
from pathlib import Path

from hexbundle.inputs import generator_digest, pinned, require_export
from hexbundle.release import release_action, verify_release_action
from hexbundle.doit_support import check_sizes, doit_config, load, options_key
from hexbundle.executor import run_step
from hexbundle.backends import describe
from hexbundle.stages import all_inputs, compile_options

ROOT = Path(__file__).resolve().parent
CFG, LAYOUT, OVERRIDES = load(ROOT)
DOIT_CONFIG = doit_config(LAYOUT)

PARTS = CFG.plan.parts()
CONFIG_FILES = [LAYOUT.rel(p) for p in CFG.config_files]
TOOLCHAIN, _ = describe(CFG.backend)
rel = LAYOUT.rel
# Steps run in threads under `doit -n 2`: don't let doit swap sys.stdout per action (racy).
NO_CAPTURE = {"capture": False}


def step(task, stage, **extra):
    """The action that runs one build step through the configured executor."""
    return (run_step, [CFG, OVERRIDES, task, stage], extra)


def task_inputs():
    """Model inputs: generated for embedded models (ONNX + .data + AIMET .encodings per graph,
    tokenizer.json); for exported models, checks the user's export is where the config says."""
    if CFG.inputs["source"] == "export":
        yield {"name": "check", "doc": "check the exported inputs are present",
               "actions": [(require_export, [CFG, LAYOUT])],
               "targets": [rel(p) for p in all_inputs(CFG, LAYOUT)],
               "uptodate": [True]}
        return
    generator = options_key(architecture=repr(CFG.model.architecture),
                            quantization=repr(CFG.model.quantization),
                            graphs=[CFG.model.context_length, CFG.model.prompt_ar,
                                    CFG.model.token_ar],
                            plan=CFG.plan.layers_per_part, seed=CFG.inputs["seed"],
                            generator=generator_digest())
    for part in PARTS:
        yield {"name": part.tag, "doc": f"generate the ONNX, weights and encodings of {part.tag}",
               "actions": [step(f"inputs:{part.tag}", "generate", part=part.index)],
               "targets": [rel(p) for g in CFG.model.graphs(part) for p in LAYOUT.graph_inputs(g)],
               "uptodate": [generator], "clean": True, "io": NO_CAPTURE}
    yield {"name": "tokenizer", "doc": "generate the byte-level BPE tokenizer.json",
           "actions": [step("inputs:tokenizer", "generate", what="tokenizer")],
           "targets": [rel(LAYOUT.tokenizer)],
           "uptodate": [options_key(vocab=CFG.model.architecture.vocab_size,
                                    specials=CFG.tokenizer_specials,
                                    generator=generator_digest())],
           "clean": True, "io": NO_CAPTURE}


def task_convert():
    """ONNX + AIMET encodings -> DLC, one per graph (quantize weights; floats to fp16)."""
    for part in PARTS:
        for graph in CFG.model.graphs(part):
            name = f"{part.tag}_{graph.kind}"
            yield {"name": name, "doc": f"convert {graph.name}",
                   "actions": [step(f"convert:{name}", "convert", part=part.index,
                                    graph=graph.kind)],
                   "file_dep": [rel(p) for p in LAYOUT.graph_inputs(graph)],
                   "targets": [rel(LAYOUT.dlc(graph))],
                   "uptodate": [options_key(backend=CFG.backend, toolchain=TOOLCHAIN,
                                            float_bitwidth=CFG.compile["float_bitwidth"],
                                            pins=pinned(CFG, LAYOUT.graph_inputs(graph)))],
                   "clean": True, "io": NO_CAPTURE}


def task_compile():
    """Prompt + token DLCs of a part -> one context binary (weight sharing, 4-bit packing)."""
    for part in PARTS:
        options = compile_options(CFG, part)
        yield {"name": part.tag, "doc": f"compile {LAYOUT.bin_name(part)}",
               "actions": [step(f"compile:{part.tag}", "compile", part=part.index)],
               "file_dep": [rel(LAYOUT.dlc(g)) for g in CFG.model.graphs(part)],
               "targets": [rel(LAYOUT.bin(part))],
               "uptodate": [options_key(backend=CFG.backend, toolchain=TOOLCHAIN,
                                        options=repr(options))],
               "clean": True, "io": NO_CAPTURE}


def task_check_sizes():
    """Check every context binary against the size model (catches unpacked 4-bit weights)."""
    return {"actions": [(check_sizes, [CFG, LAYOUT])],
            "file_dep": [rel(LAYOUT.bin(p)) for p in PARTS],
            "uptodate": [False], "verbosity": 2}


def task_bundle():
    """Check sizes, then assemble the Genie bundle: configs, tokenizer, bins, manifest."""
    return {"actions": [(check_sizes, [CFG, LAYOUT]), step("bundle", "bundle")],
            "file_dep": [rel(LAYOUT.bin(p)) for p in PARTS] + [rel(LAYOUT.tokenizer)]
            + CONFIG_FILES,
            "targets": [rel(p) for p in LAYOUT.bundle_files()],
            "uptodate": [options_key(backend=CFG.backend, toolchain=TOOLCHAIN,
                                     device=[CFG.device.name, CFG.device.soc_model,
                                             CFG.device.dsp_arch, CFG.device.htp,
                                             CFG.device.runtime], genie=CFG.genie,
                                     specials=CFG.tokenizer_specials,
                                     pins=pinned(CFG, [LAYOUT.tokenizer]))],
            "clean": True}


def task_release():
    """Clean rebuild -> build/release/: deterministic .tar.gz, SHA256SUMS, provenance.json."""
    return {"actions": [(release_action, [CFG, LAYOUT, OVERRIDES])], "uptodate": [False],
            "verbosity": 2}


def task_verify_release():
    """Rebuild a release from its provenance and compare: doit verify_release ARCHIVE."""
    return {"actions": [(verify_release_action, [ROOT])], "pos_arg": "archive",
            "uptodate": [False], "verbosity": 2}
