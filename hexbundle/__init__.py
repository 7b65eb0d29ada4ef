"""hexbundle: ONNX + AIMET encodings -> DLC -> context binary -> Genie bundle, as a doit graph."""

__version__ = "0.1.0"
