"""hexbundle's two open file formats: the DLC (one converted graph) and the context binary
(several graphs of one part). Both use the container layout in `container` (docs/formats.md).

Import the modules directly (`hexbundle.formats.ctxbin`, ...): this package imports nothing, so
that reading sizes does not pay for importing onnx.
"""
