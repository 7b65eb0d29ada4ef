"""What each backend step receives beside its files, computed in one place from the resolved
config: `convert_options` and `compile_options`.

The step uses exactly this value, and dodo.py keys the step's task on the same value (its
repr; the remote cache's Action options are that key's values, graph/remote_steps.py): a
setting the step reads cannot be missing from its key, since there is no second list of them.
Kept free of heavy imports: dodo.py imports it to declare the tasks.
"""
from __future__ import annotations

from hexbundle.backends import CompileOptions, ConvertOptions, DeviceOptions
from hexbundle.config.build import BuildConfig
from hexbundle.config.model import Part


def convert_options(cfg: BuildConfig) -> ConvertOptions:
    """The convert step's options: the [compile] settings convert reads and the model's
    treatment of weights that have no encoding."""
    c = cfg.compile
    return ConvertOptions(float_bitwidth=c["float_bitwidth"],
                          unencoded_weights=cfg.model.quantization.unencoded_weights,
                          truncate_64bit_io=c["truncate_64bit_io"], quantize_io=c["quantize_io"],
                          quantize_full_type=c["quantize_full_type"])


def compile_options(cfg: BuildConfig, part: Part) -> CompileOptions:
    """The compile step's options for a part: its graphs in bin order, the device (soc_model,
    dsp_arch, HTP settings: the bundle's runtime config reads the same device, formats.genie)
    and the [compile] settings."""
    d, htp = cfg.device, cfg.device.htp
    device = DeviceOptions(soc_model=d.soc_model, dsp_arch=d.dsp_arch,
                           perf_profile=htp["perf_profile"],
                           rpc_control_latency=htp["rpc_control_latency"], vtcm_mb=htp["vtcm_mb"])
    return CompileOptions(graph_names=tuple(g.name for g in cfg.model.graphs(part)), device=device,
                          weights_packing=cfg.compile["weights_packing"],
                          weight_sharing=cfg.compile["weight_sharing"],
                          optimization_type=cfg.compile["optimization_type"])
