"""hexbundle's task graph: ONNX -> DLC -> context binary -> Genie bundle. Nothing else lives here.

`doit list` is the manual, `doit bundle` (the default) builds. Settings come from
configs/build.toml; override them as `doit bundle model=... device=... weights_packing=...`
(`doit help TASK` lists them; `doit bundle --dry-run` says what would run).

Each task and the module that does its work, under hexbundle/:
  inputs          steps/inputs.py          generate a model's inputs, streamed (inputs/generate.py,
                                           inputs/synthetic.py), or split an export's unsplit
                                           graphs (inputs/split.py); inputs/export.py checks one
  import_export   inputs/import_export.py  a qai-hub-models export -> configs/models/NAME.toml
  inspect         checks/inspect.py        what an export, ONNX or encodings file holds; every
                                           problem the build would refuse, before building
  check_bundle    checks/genie_bundle.py   lint any Genie bundle directory (ours or not)
  convert         steps/convert.py         ONNX + AIMET encodings -> DLC (backends/), the
                                           inputs validated first (inputs/validate.py)
  compile         steps/compile.py         a part's DLCs -> one context binary (backends/);
                                           both steps' options: steps/options.py, their keys
  deploy          deploy/push.py           the bundle onto a board over SSH; --run runs it
  check_sizes     checks/sizes.py          bins vs the size model; checks/integrity.py re-hashes
  bundle          steps/bundle.py          Genie configs (formats/genie.py), manifest, bins
  verify          checks/verify.py         the bundle on the CPU (runtime/) vs the export's
                                           quantized reference (runtime/qdq.py) and float
  release         release/reproducible.py  clean rebuild, deterministic archive, provenance
  verify_release  release/reproducible.py  rebuild from a release's provenance and compare
  wheelhouse      toolchain/wheelhouse.py  the image's locked Python wheels
  contract_wheel  toolchain/wheelhouse.py  qairt-dev for the real_qairt contract tests (not the image)
  ortqnn_kit      toolchain/wheelhouse.py  the ortqnn backend's pinned Windows x64 wheels
  image           toolchain/image.py       the pinned toolchain image
  gen_inputs      inputs/generate.py       full-size stand-in inputs, streamed
  bench           bench/benchmark.py       side-by-side measurements
  offline_kit     release/offline_kit.py   everything an air-gapped machine needs
  load_kit        release/offline_kit.py   verify and load a kit (release/kit.py, standalone)
The build steps (inputs, convert, compile, bundle) run through steps/executor.py, in this process
or in the toolchain container (steps/docker_executor.py); with `remote_cache` set, inputs,
convert and compile go through a REAPI remote cache first (graph/remote_steps.py, remote/).
doit's side -- checker, up-to-date keys, run guard, reporter, the action wrapper -- is graph/.
"""
from pathlib import Path

from hexbundle.graph.actions import action
from hexbundle.graph.session import Build
from hexbundle.graph.stepdesc import NO_CAPTURE, Step

# What a task creator alone needs is imported in it: `doit list` calls none of them
# (graph.loader), so it pays for none of their imports.
ROOT = Path(__file__).resolve().parent
# The build (configs/build.toml and the command line's key=value), resolved on first use: by
# doit's settings (DOIT_CONFIG: the variant's DB) or a task creator; a plain `doit list` never
# resolves it (graph.session.Build, graph.loader).
BUILD = Build(ROOT)
DOIT_CONFIG = BUILD.doit_config

rel = BUILD.rel
# A task that reads no build setting (key=value): `doit help TASK` says so (graph/commands.py).
NO_SETTINGS = {"settings": False}
# A build step's doit task from its one description (graph/stepdesc.py): its key, file_dep,
# targets and remote Action all derive from the Step; no key field is listed here.
task = BUILD.task
STEP = {"clean": True, "io": NO_CAPTURE}


def task_inputs():
    """Model inputs: generate them (embedded models) or check the user's export is present.

    Generated: ONNX + .data + AIMET .encodings per graph, and tokenizer.json. Exported: every
    file the plan needs must be where the model config's inputs.dir says."""
    from hexbundle.steps.options import (export_check, generate_options, part_outputs,
                                         split_inputs, split_options, tokenizer_options)
    cfg, layout = BUILD.cfg, BUILD.layout
    if layout.splits_locally:
        sources = [rel(p) for p in layout.source_inputs()]
        yield {"name": "check", "doc": "check the export's unsplit graphs are present",
               "actions": [action("hexbundle.inputs.export:require_export",
                                  **export_check(layout))],
               "targets": sources,
               "uptodate": [True]}
        for part in BUILD.parts:
            yield task(Step(f"inputs:{part.tag}", "inputs", f"split {part.tag} out of the "
                            "unsplit graphs", split_options(layout),
                            inputs=split_inputs(layout),
                            outputs=part_outputs(layout, part), arguments={"part": part.index},
                            check_outputs=False, described=True, doit=STEP))
        return
    if cfg.inputs.source != "generated":
        yield {"name": "check", "doc": "check the exported inputs are present",
               "actions": [action("hexbundle.inputs.export:require_export",
                                  **export_check(layout))],
               "targets": [rel(p) for p in layout.all_inputs()],
               "uptodate": [True]}
        return
    for part in BUILD.parts:
        yield task(Step(f"inputs:{part.tag}", "inputs",
                        f"generate the ONNX, weights and encodings of {part.tag}",
                        generate_options(cfg), outputs=part_outputs(layout, part),
                        arguments={"part": part.index}, check_outputs=False, described=True,
                        before=(action("hexbundle.inputs.generate:check_pending_disk", cfg.model,
                                       BUILD.parts, layout.inputs_dir, part.index),),
                        doit=STEP))
    yield task(Step("inputs:tokenizer", "inputs", "generate the byte-level BPE tokenizer.json",
                    tokenizer_options(cfg), outputs=[("tokenizer", layout.tokenizer)],
                    arguments={"what": "tokenizer"}, check_outputs=False, described=True,
                    doit=STEP))


def task_import_export():
    """Import a qai-hub-models export as it comes: writes configs/models/NAME.toml.

    `doit import_export --dir PATH --name NAME [--plan 0,6,6,6,6,4] [--tokenizer FILE]
    [--model-config config.json] [--context-length 512,1024] [--model-id qwen3_4b]`: reads an
    export tree (0.52-0.55 or 0.46), Qualcomm's asset, unsplit graphs alone, or a 0.57-0.65
    quantize checkpoint, in place; infers the model and the plan from the files; prints what it
    found and what is missing."""
    return {"actions": [action("hexbundle.inputs.import_export:import_export", ROOT)],
            "params": [{"name": "dir", "long": "dir", "default": "",
                        "help": "the export's directory (its --onnx-export-dir)"},
                       {"name": "name", "long": "name", "default": "",
                        "help": "the model config to write (configs/models/NAME.toml)"},
                       {"name": "plan", "long": "plan", "default": "",
                        "help": "decoder layers per part, e.g. 0,6,6,6,6,4: split locally"},
                       {"name": "tokenizer", "long": "tokenizer", "default": "",
                        "help": "the model's tokenizer.json (default: DIR/tokenizer.json)"},
                       {"name": "model_config", "long": "model-config", "default": "",
                        "help": "the model's config.json: RoPE theta and scaling, RMSNorm "
                                "epsilon, tied head, family (not in the files)"},
                       {"name": "rope_theta", "long": "rope-theta", "type": float,
                        "default": 0.0, "help": "RoPE theta, overriding config.json's or the "
                                                "family's"},
                       {"name": "context_length", "long": "context-length", "default": "",
                        "help": "a quantize checkpoint: the context lengths to build, e.g. "
                                "512,1024 (default: the one its args.json records, else the "
                                "model's qai-hub-models default)"},
                       {"name": "model_id", "long": "model-id", "default": "",
                        "help": "a quantize checkpoint: the qai-hub-models model it was made "
                                "with (e.g. qwen3_4b; default: found from config.json's sizes)"}],
            "uptodate": [False], "verbosity": 2, "meta": NO_SETTINGS}


def task_inspect():
    """Inspect an export, an ONNX or an AIMET encodings file before a long build.

    `doit inspect --path FILE_OR_DIR`: per graph its inputs and outputs, op counts, IR version
    and opset, external data; per encodings file its schema and counts per (enc type, bitwidth,
    dtype, symmetric); then every problem the build would refuse (the build's own checks, all
    of them, not just the first; each weight's values are read once, streamed). Exits non-zero
    if there is any."""
    from hexbundle.steps.options import convert_options
    cfg = BUILD.cfg
    return {"actions": [action("hexbundle.checks.inspect:inspect_command",
                               float_bitwidth=convert_options(cfg).float_bitwidth)],
            "params": [{"name": "path", "long": "path", "default": "",
                        "help": "an export directory, an .onnx or an .encodings file"},
                       {"name": "model_config", "long": "model-config", "default": "",
                        "help": "the model's config.json (its special token ids)"}],
            "uptodate": [False], "verbosity": 2}


def task_check_bundle():
    """Lint any Genie bundle directory: ours, one from AI Hub, or one assembled by hand.

    `doit check_bundle --path DIR [--model-config config.json]`: the ctx-bins (present, once, in
    pipeline order, none stray), genie_config.json's structure and context size, the tokenizer's
    ids, soc_model/dsp_arch against Qualcomm's chipset table, each bin <= 4 GiB, and with the
    model's config.json its vocab, RoPE and special ids. Every problem listed; exits non-zero if
    there is any."""
    layout = BUILD.layout
    return {"actions": [action("hexbundle.checks.genie_bundle:check_bundle_command",
                               str(layout.root))],
            "params": [{"name": "path", "long": "path", "default": "",
                        "help": "the bundle directory"},
                       {"name": "model_config", "long": "model-config", "default": "",
                        "help": "the model's Hugging Face config.json (optional)"}],
            "uptodate": [False], "verbosity": 2, "meta": NO_SETTINGS}


def task_convert():
    """ONNX + AIMET encodings -> DLC, one per graph (quantize weights; floats to fp16)."""
    from hexbundle.steps.options import convert_inputs, convert_step_options
    cfg, layout = BUILD.cfg, BUILD.layout
    for part in BUILD.parts:
        for graph in cfg.model.graphs(part):
            yield task(Step(f"convert:{part.tag}_{graph.slot}", "convert",
                            f"convert {graph.name}", convert_step_options(layout, graph),
                            inputs=convert_inputs(layout, graph, part),
                            outputs=[("dlc", layout.dlc(graph))],
                            arguments={"part": part.index, "graph": graph.slot},
                            toolchain=True, described=True, doit=STEP))


def task_compile():
    """A part's DLCs -> one context binary, weights shared and 4-bit weights packed.

    The part's prompt and token graph at each context length go into one binary."""
    from hexbundle.steps.options import compile_step_options
    cfg, layout = BUILD.cfg, BUILD.layout
    for part in BUILD.parts:
        yield task(Step(f"compile:{part.tag}", "compile", f"compile {layout.bin_name(part)}",
                        compile_step_options(layout, part),
                        inputs=[("dlc", layout.dlc(g)) for g in cfg.model.graphs(part)],
                        outputs=[("bin", layout.bin(part))], arguments={"part": part.index},
                        toolchain=True, described=True, doit=STEP))


def task_check_sizes():
    """Check bin sizes against the size model; re-hash the bundle against its manifest.

    The size model catches unpacked 4-bit weights; the re-hash catches any bundle file edited,
    removed or added after the build (no digest cache, no stat shortcut)."""
    from hexbundle.steps.options import compile_options, convert_options
    cfg, layout = BUILD.cfg, BUILD.layout
    return {"actions": [action("hexbundle.checks.sizes:check_built_sizes", layout,
                               convert_options(cfg),
                               tuple(compile_options(cfg, p) for p in BUILD.parts)),
                        action("hexbundle.checks.integrity:check_bundle_integrity", layout)],
            "file_dep": [rel(layout.bin(p)) for p in BUILD.parts],
            "uptodate": [False], "verbosity": 2}


def task_bundle():
    """Check sizes, then assemble the Genie bundle: configs, tokenizer, bins, manifest."""
    from hexbundle.graph.targets import bundle_in_place
    from hexbundle.steps.options import bundle_inputs, bundle_options, bundle_outputs
    layout = BUILD.layout
    options = bundle_options(layout)
    return task(Step("bundle", "bundle", "", options, inputs=bundle_inputs(layout),
                     outputs=bundle_outputs(layout), toolchain=True,
                     before=(action("hexbundle.graph.targets:remove_dead_outputs", layout),
                             action("hexbundle.checks.sizes:check_built_sizes", layout,
                                    options.convert, options.compile)),
                     after=(action("hexbundle.graph.targets:record_build_info", layout),),
                     checks=(bundle_in_place(layout),), described=True, doit={"clean": True}))


def task_deploy():
    """Push the bundle to a board over SSH (only what differs; swapped in whole), optionally run it.

    `doit deploy --to ssh://USER@HOST[:PORT]/DIR [--run "PROMPT"] [--ssh-config FILE]
    [--path BUNDLE] [--no-push] [--timeout SECONDS]`: through the system's ssh (your config,
    agent, known_hosts);
    digests checked on the board; a not deployable (reference) bundle is refused."""
    layout = BUILD.layout
    return {"actions": [action("hexbundle.deploy.push:deploy_command")],
            "params": [{"name": "to", "long": "to", "default": "",
                        "help": "ssh://USER@HOST[:PORT]/DIR on the board"},
                       {"name": "run", "long": "run", "default": "",
                        "help": "a prompt: run the bundle there and report its speed"},
                       {"name": "ssh_config", "long": "ssh-config", "default": "",
                        "help": "an ssh config file (ssh -F)"},
                       {"name": "bundle", "long": "path", "default": str(layout.bundle_dir),
                        "help": "the bundle directory (default: the configured build's)"},
                       {"name": "timeout", "long": "timeout", "default": "120",
                        "help": "seconds the board may stay silent before deploy stops"},
                       {"name": "push_first", "long": "push", "inverse": "no-push",
                        "type": bool, "default": True,
                        "help": "--no-push: only run what is on the board"}],
            "uptodate": [False], "verbosity": 2}


def task_release():
    """Clean rebuild -> build/release/: deterministic .tar.gz, SHA256SUMS, provenance.json."""
    return {"actions": [action("hexbundle.release.reproducible:make_release", BUILD.layout,
                               BUILD.overrides)],
            "uptodate": [False],
            "verbosity": 2}


def task_verify_release():
    """Rebuild a release from its provenance and compare: doit verify_release ARCHIVE."""
    return {"actions": [action("hexbundle.release.reproducible:verify_release_command", ROOT)],
            "pos_arg": "archive", "uptodate": [False], "verbosity": 2, "meta": NO_SETTINGS}


def task_verify():
    """Run the bundle on the CPU as Genie chains it; compare with the export's quantized model.

    Exact where the build is exact: every weight, encoding and graph of every bin against the
    export (checks/exact.py). Then the bins in ctx-bins order, prefill in AR-128 chunks, AR-1
    decode with the KV cache, every activation encoding applied, vs the export's ONNX with its
    encodings applied (in onnxruntime) on the same tokens, gated against a noise floor the run
    measures (a second reference with AIMET's rounding), and the float ONNX for the drift: a
    table per part and end to end (value, floor, ratio, limit); fails naming the first part
    that diverges. Settings: the model config's [verify] table (docs/verify.md)."""
    from hexbundle.steps.options import verify_options
    cfg, layout = BUILD.cfg, BUILD.layout
    options = verify_options(cfg)
    # ortqnn: its QDQ models are compiled and run on the simulator (checks/simulated.py)
    simulated = cfg.backend == "ortqnn"
    qdq = [layout.dlc(g) for part in cfg.plan.parts() for g in cfg.model.graphs(part)]
    return task(Step("verify", "verify", "", options,
                     inputs=list(layout.bundle_files()) + list(layout.all_inputs())
                     + list(cfg.config_files) + (qdq if simulated else []),
                     outputs=[layout.verify_report], check_outputs=False, toolchain=simulated,
                     action=action("hexbundle.checks.verify:run_verify", layout, options),
                     doit={"verbosity": 2}))


def task_contract_wheel():
    """Fetch and verify the qairt-dev wheel the real_qairt contract tests load (not in the image).

    The wheel pinned by requirements/contract.lock, into build/wheelhouse/contract: the contract
    tests load the real QAIRT API classes from it."""
    from hexbundle.toolchain import wheelhouse
    return {"actions": [action("hexbundle.toolchain.wheelhouse:fetch_contract", ROOT)],
            "file_dep": [rel(ROOT / wheelhouse.CONTRACT_LOCK)],
            "uptodate": [False], "verbosity": 2, "meta": NO_SETTINGS}


def task_ortqnn_kit():
    """Fetch and verify the ortqnn backend's pinned Windows x64 wheels (build/wheelhouse/ortqnn).

    Qualcomm's HTP compiler (onnxruntime-qnn), ONNX Runtime's core DLL and the MSVC runtime, as
    requirements/ortqnn.txt pins them; the backend extracts its DLLs from there offline. Also the
    same QAIRT release's board runtime wheels (requirements/ortqnn-runtime.txt: Linux aarch64,
    Windows ARM64), which the bundle step takes its runtime files from."""
    return {"actions": [action("hexbundle.toolchain.wheelhouse:fetch_ortqnn", ROOT)],
            "file_dep": ["requirements/ortqnn.txt", "requirements/ortqnn-runtime.txt"],
            "uptodate": [False], "verbosity": 2, "meta": NO_SETTINGS}


def task_wheelhouse():
    """Fetch and verify the toolchain image's locked Python wheels (build/wheelhouse).

    CPython 3.10, manylinux x86_64 wheels named by requirements/container.lock, every sha256
    checked. Needs PyPI for missing wheels only: a complete wheelhouse brought offline is just
    verified."""
    from hexbundle.config.toolchain import load_toolchain
    from hexbundle.toolchain import wheelhouse
    toolchain = load_toolchain(ROOT)
    return {"actions": [action("hexbundle.toolchain.wheelhouse:fetch", ROOT)],
            "file_dep": [rel(toolchain.lock)],
            "targets": [rel(toolchain.wheelhouse / wheelhouse.SUMS)],
            "verbosity": 2, "meta": NO_SETTINGS}


def task_image():
    """Build the pinned toolchain image (docker SDK, no network); record its ID.

    CPython 3.10, the hashed lock, and QAIRT when its archive is staged (configs/toolchain.toml;
    without it the image runs the reference backend only and its labels say so). `--base REF` builds on
    another base (no registry: scripts/make_base_image.sh makes one); `--network default` lets
    a base without python3.10 install it. Preconditions first: the SDK archive's pin, a Docker
    engine that answers and the base image in it are checked before the locked wheels the
    wheelhouse lacks are fetched (as `doit wheelhouse` does). Log: build/logs/image.log; ID:
    build/image/."""
    from hexbundle.graph.keys import image_unchanged
    from hexbundle.toolchain import image
    layout = BUILD.layout
    return {"actions": [action("hexbundle.toolchain.image:build", ROOT)],
            "params": [{"name": "base", "long": "base", "default": "",
                        "help": "base image reference (default: configs/toolchain.toml)"},
                       {"name": "network", "long": "network", "default": "none",
                        "help": "network of the build's RUN steps (default: none)"}],
            "file_dep": [rel(p) for p in image.build_inputs(ROOT)],
            "targets": [rel(layout.image_id_file)],
            "uptodate": [image_unchanged(ROOT)],
            "verbosity": 2, "meta": NO_SETTINGS}


def task_gen_inputs():
    """Write stand-in inputs with the model's real shapes (random weights), streamed.

    The model's tensor shapes, graph I/O and encodings with random weights from a fixed seed,
    written tensor by tensor where the build reads them: e.g. `doit gen_inputs
    model=qwen2.5-7b-instruct` writes ~30 GB into its exports dir (`--part N`: one part). Free
    disk space is checked first. The same files as scripts/gen_7b_inputs.py."""
    cfg, layout = BUILD.cfg, BUILD.layout
    return {"actions": [action("hexbundle.inputs.generate:generate_action", cfg.model, cfg.plan,
                               layout.inputs_dir, cfg.inputs.seed, cfg.tokenizer_specials,
                               rel(layout.inputs_dir))],
            "params": [{"name": "part", "long": "part", "type": int, "default": 0,
                        "help": "only this part of the plan (1-based; 0 = every part)"}],
            "uptodate": [False], "verbosity": 2}


def task_bench():
    """Benchmark the build (scripts/bench.py): one table of side-by-side ratios.

    Digests vs doit's MD5 checker, no-op run vs `doit list`, touched inputs, one-part rebuild,
    reference backend GB/s and peak RSS, -n 2 vs -n 1, split and import, a cache-hit build
    through a local BuildGrid vs the full build, a build on 2 REAPI workers vs -n 1 (row 12),
    Qualcomm's simulator on the largest part vs onnxruntime CPU (row 13, the ortqnn kit),
    on the Qwen2.5-7B-shaped model (~17 GB of disk; `--small`: qwen2-tiny, minutes;
    `--rows 9`: that row only).
    Table printed, results in build/bench/results.json."""
    return {"actions": [action("hexbundle.bench.benchmark:run_bench", ROOT)],
            "params": [{"name": "small", "long": "small", "type": bool, "default": False,
                        "help": "qwen2-tiny instead of the 7B shape"},
                       {"name": "keep", "long": "keep", "type": bool, "default": False,
                        "help": "keep the benchmark tree in build/bench/"},
                       {"name": "rows", "long": "rows", "default": "",
                        "help": "only these rows, e.g. 9 or 1,5 (default: all)"}],
            "uptodate": [False], "verbosity": 2, "meta": NO_SETTINGS}


def task_offline_kit():
    """Write build/offline-kit(.tar, .tar.sha256) + build/load_kit.py: image, wheels, source."""
    layout = BUILD.layout
    return {"actions": [action("hexbundle.release.offline_kit:offline_kit_command", layout)],
            "uptodate": [False],
            "verbosity": 2}


def task_load_kit():
    """Verify an offline kit (its archive's sha256, every checksum), then load its images."""
    return {"actions": [action("hexbundle.release.offline_kit:load_kit_command")],
            "pos_arg": "kit", "uptodate": [False],
            "params": [{"name": "expect_sha256", "long": "expect-sha256", "default": "",
                        "help": "the archive's sha256, as `doit offline_kit` printed it"}],
            "verbosity": 2, "meta": NO_SETTINGS}
