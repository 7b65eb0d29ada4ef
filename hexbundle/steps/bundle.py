"""Step `bundle`: the Genie bundle -- genie_config.json, htp_backend_ext_config.json,
tokenizer.json, the context binaries (hard links, not copies) and manifest.json.

Every value is derived (formats.genie): context size, n-vocab, kv-dim, pos-id-dim and rope-theta
from the model config; bos/eos/eot ids looked up in the tokenizer by content; soc_model /
dsp_arch from the one resolved device (config.devices) that also fed the compile. The bundle is
assembled in a staging directory and swapped in whole, so a failed assembly never damages the
previous bundle.

The step receives its description (steps/description.py) and nothing else: its inputs by role
("bin" per part, "tokenizer", the graphs' "onnx" and "encodings" in bin order for the size
model, the "source" and "config" files the manifest digests, and the files a board's runtime
comes from: "runtime" with "runtime-pins" (ortqnn's wheel and its pin file) or
"runtime-release" and "runtime-genie" (a local SDK's sdk.yaml and Genie header)), its outputs
("manifest": the bundle directory is its folder) and its options
(config.step_options.BundleOptions).
build-info.json (which steps came from a remote cache) is written after it, by the doit run
(graph.targets.record_build_info): the records it reads are no input of the step.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from hexbundle.backends.registry import get_backend
from hexbundle.checks import sizes
from hexbundle.checks.genie_bundle import check_bundle
from hexbundle.config.layout import GENIE_CONFIG, HTP_EXT_CONFIG, MANIFEST, TOKENIZER
from hexbundle.config.step_options import BundleOptions
from hexbundle.config.toolchain import read_sdk_version
from hexbundle.formats.genie import genie_config, htp_backend_ext_config
from hexbundle.formats.genie_clients import write_clients
from hexbundle.formats.manifest import bundle_files, bundle_manifest
from hexbundle.formats.tokenizer import special_token_ids
from hexbundle.inputs.pins import require_pins
from hexbundle.steps.description import Description
from hexbundle.support import hashing, testhooks
from hexbundle.support.atomic import staged_dir, write_json
from hexbundle.support.errors import InputError, OutputError, output_error


def assemble_bundle(described: Description, log) -> None:
    options: BundleOptions = described.options
    require_pins([described.input("tokenizer")], dict(options.pins), options.model_config)
    # The manifest records what the size check judged by: the size the inputs' tensors make.
    expectations = expected_sizes(described)
    bins = described.input_paths("bin")
    expected = {b.name: e.packed for b, e in zip(bins, expectations)}
    unencoded = {name: dtype for e in expectations for name, dtype in e.unencoded}
    if unencoded:
        log(f"{len(unencoded)} layer weight(s) without an encoding, stored by the policy "
            f"unencoded_weights = {options.convert.unencoded_weights!r}: "
            + ", ".join(f"{n} ({d})" for n, d in sorted(unencoded.items())[:8])
            + (" ..." if len(unencoded) > 8 else ""))
    final = assemble(described, get_backend(options.backend).toolchain_version(), expected,
                     log, unencoded)
    log(f"bundle ready: {final}")


def expected_sizes(described: Description) -> list:
    """Each part's expectation (checks.sizes) from its graphs' ONNX and encodings, in bin order:
    the description's "onnx" / "encodings" inputs, the part's graph names in its CompileOptions."""
    o: BundleOptions = described.options
    onnx, encodings = described.input_paths("onnx"), described.input_paths("encodings")
    out, start = [], 0
    for c in o.compile:
        names = c.graph_names
        graphs = [sizes.NamedGraph(name, onnx[start + i], encodings[start + i],
                                   o.convert.unencoded_weights) for i, name in enumerate(names)]
        out.append(sizes.expect_part_files(graphs, o.convert, c))
        start += len(names)
    return out


def image_of(described: Description) -> str:
    """The toolchain image the manifest names: the one the docker executor ran the step in;
    none with the local executor (the executor is in the step's key: switching rebuilds)."""
    return described.image if described.options.executor == "docker" else ""


def link_or_copy(src: Path, dst: Path) -> str:
    """Hard link (bundle time does not grow with model size); copy across filesystems."""
    try:
        os.link(src, dst)
        return "linked"
    except OSError:
        shutil.copy2(src, dst)
        return "copied"


def lint(staging: Path, options: BundleOptions, log) -> None:
    """The bundle as `doit check_bundle` judges any bundle, before it is swapped in: a bundle
    this step makes must pass it (the device pair: the one the config resolved, which its load
    checked against Qualcomm's table)."""
    device = options.genie.device
    report = check_bundle(staging, {device.soc_model: device.dsp_arch})
    if report.problems:
        raise OutputError("the assembled bundle fails check_bundle (the previous bundle is "
                          "kept): " + "; ".join(report.problems))
    log(f"check_bundle: no problem ({len(report.checked)} checks)")


def qairt_runtime(described: Description, bins: list, staging: Path, log) -> dict:
    """The qairt bundle's runtime, from the SDK that compiled the bins, after checking each bin
    against it and the device (backends/qairt_runtime.py)."""
    from hexbundle.backends.qairt_runtime import (RuntimePlan, bundle_runtime, check_bins,
                                                  runtime_release)
    options: BundleOptions = described.options
    backend = get_backend("qairt")   # the toolchain: its qnn-context-binary-utility reads bins
    sdk = sdk_runtime(described, backend)
    device = options.genie.device
    plan = RuntimePlan(options.runtime, options.target, device.dsp_arch, device.soc_model,
                       read_sdk_version(sdk.release_file), htp_device_id=options.genie.device_id)
    release = runtime_release(sdk, plan)
    log(f"runtime: QAIRT {release.release} ({release.release.text}), read from the SDK's "
        f"files for {plan.target} and sdk.yaml")
    records = check_bins({b.name: backend.bin_info(b, log) for b in bins}, plan, release)
    try:
        section = bundle_runtime(sdk, plan, release, staging, log)
    except OSError as exc:   # a full disk while copying: the previous bundle stays
        raise output_error(exc.filename or staging, exc) from None
    return {**section, "bins": records}


def sdk_runtime(described: Description, backend):
    """The SDK files the runtime comes from. With the local executor they are the description's
    "runtime", "runtime-release" (sdk.yaml) and "runtime-genie" inputs (steps/options.
    bundle_inputs): their digests are the step's key, and a worker holds them. With the docker
    executor none is declared: the step runs in the toolchain image, whose SDK it reads, and the
    image's ID in the step's key stands for those files."""
    from hexbundle.backends.qairt_runtime import SdkRuntime
    o: BundleOptions = described.options
    if o.executor == "docker":
        return SdkRuntime.at(backend.sdk.root, o.target, o.genie.device.dsp_arch)
    return SdkRuntime.declared(described.input("runtime-release"),
                               described.input("runtime-genie"),
                               described.input_paths("runtime"))


def ortqnn_runtime(described: Description, bins: list, staging: Path, log) -> dict:
    """The ortqnn bundle's runtime, from the pinned onnxruntime-qnn wheel of the compiler's QAIRT
    release for the board's OS, after checking the bins and its files are that one release
    (backends/ortqnn_runtime.py). The wheel and the pin file are the description's "runtime" and
    "runtime-pins" inputs: their digests are the step's key, and a worker holds them."""
    from hexbundle.backends.ortqnn import QAIRT_RELEASE
    from hexbundle.backends.ortqnn_runtime import bundle_runtime
    from hexbundle.backends.qairt_runtime import RuntimePlan
    options: BundleOptions = described.options
    device = options.genie.device
    plan = RuntimePlan(options.runtime, options.target, device.dsp_arch, device.soc_model,
                       QAIRT_RELEASE, htp_device_id=options.genie.device_id)
    try:
        return bundle_runtime(described.input("runtime-pins"), described.input_paths("runtime"),
                              plan, bins, staging, QAIRT_RELEASE, log)
    except OSError as exc:   # a full disk while extracting: the previous bundle stays
        raise output_error(exc.filename or staging, exc) from None


def board_runtime(described: Description, bins: list, staging: Path, log):
    """The manifest's runtime section of a backend whose bins a board loads; None otherwise."""
    backend = described.options.backend
    if backend == "qairt":
        return qairt_runtime(described, bins, staging, log)
    if backend == "ortqnn":
        return ortqnn_runtime(described, bins, staging, log)
    return None


def assemble(described: Description, backend_version: str, sizes_expected: dict, log,
             unencoded: dict = None) -> Path:
    options: BundleOptions = described.options
    bins, tokenizer = described.input_paths("bin"), described.input("tokenizer")
    for b in bins:
        if not b.is_file():
            raise InputError(f"{b}: context binary missing; run `doit bundle` to build it")
    token_ids = special_token_ids(tokenizer, dict(options.specials), options.genie.n_vocab)
    final = described.output("manifest").parent
    final.parent.mkdir(parents=True, exist_ok=True)
    # Linking a bin (and removing the old bundle's names) changes its ctime, not its bytes.
    carry = hashing.cache().carry_over(bins)
    with staged_dir(final) as staging:   # swapped in whole when complete, removed on failure
        write_json(staging / GENIE_CONFIG, genie_config(options.genie, token_ids,
                                                           [b.name for b in bins]))
        write_json(staging / HTP_EXT_CONFIG, htp_backend_ext_config(options.genie))
        try:
            shutil.copyfile(tokenizer, staging / TOKENIZER)
            for b in bins:
                how = link_or_copy(b, staging / b.name)
                log(f"{b.name}: {how} ({b.stat().st_size / sizes.MIB:.2f} MiB)")
        except OSError as exc:   # a full disk while copying: the previous bundle stays
            raise output_error(exc.filename or staging, exc) from None
        carry.adopt(bins + [staging / b.name for b in bins])
        runtime = board_runtime(described, bins, staging, log)
        clients = write_clients(staging, options.manifest.model, runtime, bundle_files(staging),
                                link_or_copy)
        if clients:
            log(f"other Genie clients: {', '.join(clients)} (docs/deploy.md)")
        write_json(staging / MANIFEST, bundle_manifest(
            staging, options, backend_version, sizes_expected, unencoded or {}, runtime,
            image_of(described), sources=described.input_paths("source"),
            configs=described.input_paths("config")))
        lint(staging, options, log)
        os.chmod(staging, 0o755)
        testhooks.pause_point()   # tests kill the run here: staging complete, not swapped in
    carry.adopt(bins + [final / b.name for b in bins])
    return final
