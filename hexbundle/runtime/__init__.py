"""Running a bundle on the host as Genie does: the runtime conventions, the CPU interpreter of a
context binary's graphs, the float ONNX reference, part sessions chained as Genie chains them,
and text generation."""
