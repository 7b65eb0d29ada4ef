"""Numbers past the field they end in (issue 40, kind 7): every number of the configs' schemas has
its destination's range (a 32-bit Genie count or seed, a uint64 byte budget, docker's int64
sizes, a TCP port), and a special token holds no control character."""
import re
from pathlib import Path

import pytest

from hexbundle.config.build import load_build
from hexbundle.support.errors import ConfigError
from conftest import copy_project

MODEL = "configs/models/qwen2-tiny.toml"
BOARD = "configs/boards/iq9075.toml"


def set_key(root: Path, rel: str, table: str, key: str, value: str) -> None:
    """`key = value` in [table] of the file (replacing the key if it is there)."""
    path = root / rel
    text = path.read_text()
    header = f"[{table}]\n"
    start = text.index(header) + len(header)
    end = text.find("\n[", start)
    end = len(text) if end < 0 else end + 1
    body = re.sub(rf"^{re.escape(key)} = .*\n", "", text[start:end], flags=re.M)
    path.write_text(text[:start] + f"{key} = {value}\n" + body + text[end:])


def in_file(rel, table, key, value):
    def setup(root):
        set_key(root, rel, table, key, value)
        return {}
    return setup


def on_command_line(**settings):
    return lambda root: {k.replace("__", "."): v for k, v in settings.items()}


# (id, setup, the key the message names): one case per number (or token) of the schemas whose
# destination is narrower than what the schema took.
CASES = [
    ("sampler_seed-2**64", in_file(MODEL, "genie", "sampler_seed", str(2 ** 64)),
     "genie.sampler_seed"),
    ("sampler_seed-2**32", in_file(MODEL, "genie", "sampler_seed", str(2 ** 32)),
     "genie.sampler_seed"),
    ("top_k-2**32", in_file(MODEL, "genie", "top_k", str(2 ** 32)), "genie.top_k"),
    ("temp-past-float32", in_file(MODEL, "genie", "temp", "1e39"), "genie.temp"),
    ("max_num_tokens-2**32", in_file(MODEL, "genie", "max_num_tokens", str(2 ** 32)),
     "genie.max_num_tokens"),
    ("rope_theta-past-int32", in_file(MODEL, "architecture", "rope_theta", "5e9"),
     "architecture.rope_theta"),
    ("inputs-seed-2**64", in_file(MODEL, "inputs", "seed", str(2 ** 64)), "inputs.seed"),
    ("verify-seed-2**64", in_file(MODEL, "verify", "seed", str(2 ** 64)), "verify.seed"),
    ("expected_total_mib-1e300", in_file(MODEL, "plans.four", "expected_total_mib", "1e300"),
     "expected_total_mib"),
    ("layers_per_part-huge", in_file(MODEL, "plans.four", "layers_per_part",
                                     f"[0, {2 ** 70}, 1, 1]"), "layers_per_part"),
    ("mmap_budget-2**64", in_file(BOARD, "runtime", "mmap_budget", str(2 ** 64)),
     "runtime.mmap_budget"),
    ("spill_fill_bufsize-2**64", in_file(BOARD, "runtime", "spill_fill_bufsize",
                                         str(2 ** 64)), "runtime.spill_fill_bufsize"),
    ("cpu_mask-past-64-cpus", in_file(BOARD, "runtime", "cpu_mask", '"0x1' + "0" * 16 + '"'),
     "runtime.cpu_mask"),
    ("container-memory-past-int64", on_command_line(container__memory="99999999999g"),
     "container.memory"),
    ("container-tmp_size-past-int64",
     on_command_line(container__memory="1g", container__tmp_size="99999999999999999999"),
     "container.tmp_size"),
    ("container-uid-past-32-bits", on_command_line(container__user="4294967296:1"),
     "container.user"),
    ("container-uid-minus-one", on_command_line(container__user="4294967295:1"),
     "container.user"),
    ("remote-port-99999", on_command_line(remote_cache="grpc://host:99999"), "port"),
    ("remote-port-0", on_command_line(remote_cache="grpc://host:0"), "port"),
    ("bos-NUL", in_file(MODEL, "tokenizer", "bos", '"\\u0000"'), "tokenizer.bos"),
    ("eos-ESC", in_file(MODEL, "tokenizer", "eos", '"<|im_end|>\\u001b"'), "tokenizer.eos"),
    ("eot-C1", in_file(MODEL, "tokenizer", "eot", '"\\u0085"'), "tokenizer.eot"),
]


@pytest.mark.parametrize("setup, named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_number_has_its_destinations_range(tmp_path, setup, named):
    copy_project(tmp_path, ("configs",))
    overrides = setup(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_build(tmp_path, overrides)
    assert named in str(caught.value)


@pytest.mark.parametrize("setup", [
    in_file(MODEL, "genie", "sampler_seed", str(2 ** 32 - 1)),
    in_file(MODEL, "genie", "top_k", str(2 ** 32 - 1)),
    in_file(BOARD, "runtime", "mmap_budget", str(2 ** 64 - 1)),
    in_file(BOARD, "runtime", "cpu_mask", '"0xffffffffffffffff"'),
    on_command_line(remote_cache="grpc://host:65535"),
    on_command_line(container__user="4294967294:4294967294"),
], ids=["seed-max", "top_k-max", "mmap_budget-max", "cpu_mask-64", "port-max", "uid-max"])
def test_the_largest_value_each_destination_holds_is_taken(tmp_path, setup):
    copy_project(tmp_path, ("configs",))
    load_build(tmp_path, setup(tmp_path))


# each [genie] setting -> the genie_config.json key it is written to (formats/genie.py)
GENIE_DESTINATIONS = {"max_num_tokens": "dialog.max-num-tokens",
                      "sampler_seed": "dialog.sampler.seed", "temp": "dialog.sampler.temp",
                      "top_k": "dialog.sampler.top-k", "top_p": "dialog.sampler.top-p"}


def test_every_genie_setting_is_bounded_within_what_check_bundle_accepts_where_it_lands():
    """The config's range of a [genie] number and check_bundle's range of the key it lands in
    agree: a value the config takes is never one check_bundle refuses (nor a value past the
    destination taken by the config and then refused on the bundle)."""
    from hexbundle.config.build import MODEL_SCHEMA
    from hexbundle.formats.genie_ranges import RANGES
    genie = MODEL_SCHEMA["genie"].type
    assert set(genie) == set(GENIE_DESTINATIONS), "a [genie] setting without its destination here"
    for key, destination in GENIE_DESTINATIONS.items():
        field, accepted = genie[key], RANGES[destination]
        assert field.min is not None and field.max is not None, key
        assert accepted.holds(field.min) and accepted.holds(field.max), (
            f"genie.{key} takes {field.min}..{field.max}; check_bundle accepts {destination} "
            f"{accepted.describe()}")
