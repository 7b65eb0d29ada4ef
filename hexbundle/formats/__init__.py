"""One module per file format, each with its reader and writer (docs/formats.md):

  container   the shared container layout of hexbundle's open binary formats
  dlc         a converted graph (reference backend)
  ctxbin      a context binary: the graphs of one part (reference backend)
  encodings   AIMET .encodings (reader; AIMET writes them)
  genie       genie_config.json and htp_backend_ext_config.json
  manifest    the bundle's manifest.json and build-info.json
  tokenizer   tokenizer.json (what a bundle needs of it)

Import the modules directly (`hexbundle.formats.ctxbin`, ...): this package imports nothing, so
that reading sizes does not pay for importing onnx.
"""
