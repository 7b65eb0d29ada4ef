"""One module per file format, each with its reader and writer (docs/formats.md):

  container   the shared container layout of hexbundle's open binary formats
  dlc         a converted graph (reference backend)
  ctxbin      a context binary: the graphs of one part (reference backend)
  encodings   AIMET .encodings (reader; AIMET writes them)
  genie       genie_config.json and htp_backend_ext_config.json
  manifest    the bundle's manifest.json and build-info.json
  tokenizer   tokenizer.json (what a bundle needs of it)
  stepkey     a build step's key: its typed options as canonical JSON (docs/step-key.md)

Import the modules directly (`hexbundle.formats.ctxbin`, ...): this package imports nothing, so
that reading sizes does not pay for importing onnx.
"""

# The version of the container layout (container.py writes and checks it). Here, not there, so
# that the reference backend's version (backends.describe: every doit run asks, for the banner and
# the up-to-date keys) costs no numpy import.
FORMAT_VERSION = 2   # 2: float32 offsets, per-block groups (AIMET PER_BLOCK, LPBQ)
