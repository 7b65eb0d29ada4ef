"""Qualcomm's facts about its chipsets, read out of a qai-hub-models wheel (a zip; nothing of it
is imported or run): devices_and_chipsets.yaml (names, aliases, soc_model, htp_version) and the
LLM helpers whose `create_genie_config` / `save_htp_config_for_genie_bundle` write a Genie
bundle's configs (the runtime defaults), read as a syntax tree, literals only.

config/devices_table.py renders them as configs/devices.toml; config/devices.py loads that.
"""
from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexbundle.config.devices import FIRST_HTP_ARCH, QUALCOMM_PREFIX
from hexbundle.support.errors import ConfigError


@dataclass(frozen=True)
class QualcommFacts:
    version: str                 # the qai-hub-models release
    wheel_sha256: str
    chipsets_file: str           # paths inside the wheel
    chipsets_sha256: str
    generator_file: str
    generator_sha256: str
    chipsets: dict               # Qualcomm's name -> its yaml entry
    genie: dict                  # what create_genie_config writes (dialog keys)
    htp_ext: dict                # what save_htp_config_for_genie_bundle writes
    max_num_tokens: int          # create_genie_config's max-num-tokens


CHIPSETS_FILE = "qai_hub_models/devices_and_chipsets.yaml"
GENERATOR_FILE = "qai_hub_models/models/templates/llm/llm_helpers.py"


def read_qualcomm_wheel(wheel: Path) -> QualcommFacts:
    """Qualcomm's facts out of a qai-hub-models wheel (a zip; nothing of it is imported)."""
    import zipfile
    wheel = Path(wheel)
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            missing = [f for f in (CHIPSETS_FILE, GENERATOR_FILE) if f not in names]
            if missing:
                raise ConfigError(f"{wheel}: has no {', '.join(missing)}; give a qai-hub-models "
                                  "wheel of a release that has them (0.65.0 does)")
            metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
            version = re.search(r"^Version: (\S+)$", zf.read(metadata).decode(), re.M).group(1)
            texts = [zf.read(f).decode() for f in (CHIPSETS_FILE, GENERATOR_FILE)]
    except (OSError, zipfile.BadZipFile, StopIteration, AttributeError) as exc:
        raise ConfigError(f"{wheel}: not a readable qai-hub-models wheel ({exc})") from None
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return qualcomm_facts(version, CHIPSETS_FILE, texts[0], GENERATOR_FILE, texts[1], digest)


def qualcomm_facts(version: str, chipsets_file: str, chipsets_text: str, generator_file: str,
                   generator_text: str, wheel_sha256: str = "") -> QualcommFacts:
    """Read Qualcomm's chipset table (YAML) and its Genie bundle generator (Python source, read
    as a syntax tree: literals only, never run)."""
    import yaml   # only the generator script needs it (pip install pyyaml)
    chipsets = yaml.safe_load(chipsets_text)["chipsets"]
    functions = {n.name: n for n in ast.walk(ast.parse(generator_text))
                 if isinstance(n, ast.FunctionDef)}
    constants = _module_constants(ast.parse(generator_text))
    genie = _assigned_dict(functions["create_genie_config"], "inner", constants)
    genie["engine"]["backend"]["QnnHtp"] = _assigned_dict(functions["create_genie_config"],
                                                          "qnn_htp", constants)
    genie["sampler"] = _assigned_dict(functions["create_genie_config"], "sampler", constants)
    htp_ext = _assigned_dict(functions["save_htp_config_for_genie_bundle"], "htp_config",
                             constants)
    return QualcommFacts(version, wheel_sha256, chipsets_file, _sha256(chipsets_text),
                         generator_file, _sha256(generator_text), chipsets, genie, htp_ext,
                         genie["max-num-tokens"])


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


_NOT_LITERAL = object()


def _module_constants(tree: ast.Module) -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            value = _literal(node.value, {})
            if value is not _NOT_LITERAL:
                out[node.targets[0].id] = value
    return out


def _literal(node: ast.AST, constants: dict) -> Any:
    """A literal (module constants resolved); a dict keeps its literal entries only."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id, _NOT_LITERAL)
    if isinstance(node, ast.List):
        items = [_literal(e, constants) for e in node.elts]
        return _NOT_LITERAL if _NOT_LITERAL in items else items
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            key, value = _literal(k, constants) if k is not None else _NOT_LITERAL, \
                _literal(v, constants)
            if isinstance(key, str) and value is not _NOT_LITERAL:
                out[key] = value
        return out
    return _NOT_LITERAL


def _assigned_dict(function: ast.FunctionDef, variable: str, constants: dict) -> dict:
    for node in ast.walk(function):
        target = node.target if isinstance(node, ast.AnnAssign) else \
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id == variable and \
                isinstance(node.value, ast.Dict):
            return _literal(node.value, constants)
    raise ValueError(f"{function.name}() assigns no dict literal to {variable!r}; Qualcomm's "
                     "generator changed: update hexbundle.config.qualcomm_wheel")


def short_name(qualcomm_name: str) -> str:
    """qualcomm-sa8775p -> sa8775p: device=NAME without the vendor prefix every entry has."""
    return qualcomm_name.removeprefix(QUALCOMM_PREFIX)


def htp_chipsets(facts: QualcommFacts) -> dict:
    """Qualcomm's chipsets with an HTP, by hexbundle name, sorted."""
    return {short_name(n): c for n, c in sorted(facts.chipsets.items())
            if c["htp_version"] >= FIRST_HTP_ARCH}


def dsp_arch(chip: dict) -> str:
    """Qualcomm's htp_version 73 -> QAIRT's dsp_arch "v73"."""
    return f"v{chip['htp_version']}"


def soc_models(facts: QualcommFacts) -> dict:
    """soc_model -> (dsp_arch, Qualcomm names); Qualcomm's own table must agree with itself."""
    out = {}
    for name, chip in sorted(facts.chipsets.items()):
        arch = dsp_arch(chip)
        have = out.setdefault(chip["soc_model"], (arch, []))
        if have[0] != arch:
            raise ValueError(f"{facts.chipsets_file}: soc_model {chip['soc_model']} is {have[0]} "
                             f"for {have[1]} but {arch} for {name}")
        have[1].append(name)
    return out
