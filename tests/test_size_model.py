"""Each container format's plan_layout() against the file its writer makes: every blob's name,
offset and size, the header's offset and length, the file size, to the byte. The size check
(checks/sizes.py) predicts context binaries through ctxbin.plan_layout, so a writer change that
the plan does not follow fails here, not in a build's size table."""
from __future__ import annotations

import pytest

from hexbundle.formats import ctxbin, dlc
from hexbundle.formats.container import (PREAMBLE, ContainerReader, ContainerWriter, TensorStream,
                                         plan_layout)
from test_formats import (DEVICE, PRODUCER, info, source, tensors, topology_bytes,  # noqa: F401
                          write_test_bin, write_test_dlc)


def streams(source, scale_bump=1.0):
    """The test tensors as the size model sees them: records only, no value ever produced."""
    def no_values():
        raise AssertionError("plan_layout asked for a tensor's values")
    return tuple(TensorStream(t.name, t.dtype, t.values.shape, no_values, t.quant)
                 for t in tensors(source, scale_bump))


def assert_same(planned, path, magic):
    reader = ContainerReader(path, magic, "test file")
    try:
        written = reader.layout
    finally:
        reader.close()
    assert [(b.name, b.offset, b.nbytes) for b in planned.blobs] == \
        [(b.name, b.offset, b.nbytes) for b in written.blobs]
    assert (planned.header_offset, planned.header_length) == \
        (written.header_offset, written.header_length)
    assert planned.size == written.size == path.stat().st_size


def test_the_container_plan_is_the_containers_layout(tmp_path):
    sizes = [("empty", 0), ("one", 1), ("page", 4096), ("page+1", 4097), ("odd", 12345)]
    fields = {"kind": "test", "note": "x" * 333}
    path = tmp_path / "c.bin"
    with ContainerWriter(path, b"HXTEST\0\0") as writer:
        for name, n in sizes:
            writer.add_blob(name, [bytes(range(256)) * (n // 256) + bytes(n % 256)])
        writer.finish(fields)
    assert_same(plan_layout(sizes, fields), path, b"HXTEST\0\0")


def test_the_dlc_plan_is_the_written_dlcs_layout(tmp_path, source):
    path = tmp_path / "g.dlc"
    write_test_dlc(path, source)
    planned = dlc.plan_layout(dlc.DlcGraph(info("g"), topology_bytes(), streams(source),
                                           PRODUCER, 16, "/abs/dir/model.onnx",
                                           "/abs/dir/model.encodings"))
    assert_same(planned, path, dlc.DLC_MAGIC)


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("sharing", [True, False])
def test_the_ctxbin_plan_is_the_written_bins_layout(tmp_path, source, packing, sharing):
    path = tmp_path / "m.bin"
    write_test_bin(path, source, packing, sharing)
    graphs = [ctxbin.PlannedGraph(info(name), len(topology_bytes()), streams(source))
              for name in ("prompt", "token")]
    fields = ctxbin.header_fields(producer=PRODUCER, deployable=False, device=DEVICE,
                                  weights_packing=packing, weight_sharing=sharing,
                                  optimization_type=3, vtcm_mb=8)
    planned = ctxbin.plan_layout(graphs, fields)
    assert_same(planned, path, ctxbin.CTXBIN_MAGIC)
    # sharing stores each weight once: two topologies and four weights, else eight
    assert len(planned.blobs) == 2 + 4 * (1 if sharing else 2)


def test_the_read_layout_is_the_preambles(tmp_path, source):
    """What the tests above compare with is read by the container's reader: its header offset
    and length are the preamble's."""
    path = tmp_path / "g.dlc"
    write_test_dlc(path, source)
    fields = PREAMBLE.unpack(path.read_bytes()[:PREAMBLE.size])
    with dlc.read_dlc(path) as reader:
        assert (reader.layout.header_offset, reader.layout.header_length) == (fields[3], fields[4])


def test_the_weight_data_plan_is_the_generated_data_files_layout(tmp_path):
    """formats/weightdata: the windows the generated ONNX records for its weights, and the .data
    file's size, are plan_layout's (both generators write it: whole weights and streamed)."""
    import onnx
    from conftest import CONFIGS
    from hexbundle.config.build import load_build
    from hexbundle.config.layout import graph_files
    from hexbundle.formats import weightdata
    from hexbundle.inputs import generate, synthetic, synthetic_weights
    cfg = load_build(CONFIGS)
    part = cfg.plan.parts()[-1]   # the LM head's part: the widest weights
    shapes = {s.name: s.shape for s in synthetic_weights.weight_specs(cfg.model, part)}
    planned = weightdata.plan_layout(shapes)
    for name, write in (("whole", synthetic.generate_part), ("streamed", generate.generate_part)):
        write(cfg.model, part, tmp_path / name, 3)
        onnx_path, data_path, _ = graph_files(tmp_path / name, cfg.model.graphs(part)[0])
        model = onnx.load(str(onnx_path), load_external_data=False)
        recorded = {}
        for init in model.graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                entry = {e.key: e.value for e in init.external_data}
                recorded[init.name] = (int(entry.get("offset", 0)), int(entry["length"]))
        assert recorded == planned
        assert data_path.stat().st_size == weightdata.data_size(shapes)
        assert all(offset % weightdata.DATA_ALIGNMENT == 0 for offset, _ in planned.values())
