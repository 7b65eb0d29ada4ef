#!/usr/bin/env python3
"""Try a built bundle on the host, as `genie-t2t-run` would on the device.

    python3 scripts/generate.py -p "Hello, how are you?" -n 32 [--greedy] [--engine onnx] [key=value ...]

The prompt is tokenized with the bundle's tokenizer.json as given (add the chat template
yourself, as with genie-t2t-run), prefilled, and up to N tokens are sampled with the bundle's
sampler settings (genie_config.json), or greedily with --greedy. --engine onnx runs the float
ONNX sources instead of the context binaries (the reference verify compares against).
key=value settings are those of `doit bundle` (model=..., device=..., plan=...).
The work is hexbundle.runtime.generation.generate_text.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hexbundle.config.build import load_build  # noqa: E402
from hexbundle.support.errors import HexbundleError  # noqa: E402
from hexbundle.config.layout import Layout  # noqa: E402
from hexbundle.runtime.generation import generate_text  # noqa: E402


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--prompt", required=True, help="prompt text")
    parser.add_argument("-n", "--max-tokens", type=int, default=None,
                        help="tokens to generate (default: the bundle's max-num-tokens)")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    parser.add_argument("--engine", choices=("bundle", "onnx"), default="bundle")
    parser.add_argument("--bundle", type=Path, default=None,
                        help="bundle directory (default: the one `doit bundle` builds)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("settings", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"{item!r}: settings are key=value")
        overrides[key] = value
    return args, overrides


def main(argv) -> int:
    args, overrides = parse(argv)
    try:
        cfg = load_build(ROOT, overrides)
        stream = None if args.json else (lambda text: print(text, end="", flush=True))
        layout = Layout(cfg)
        result = generate_text(cfg, args.bundle or layout.bundle_dir, layout.every_graph_files(),
                               args.prompt, args.max_tokens, engine=args.engine,
                               greedy=args.greedy, on_text=stream)
    except HexbundleError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"engine": args.engine, "prompt_ids": result.prompt_ids,
                          "token_ids": result.token_ids, "text": result.text,
                          "stopped": result.stopped,
                          "tokens_per_second": round(result.tokens_per_second, 2)}))
    else:
        print(f"\n[{args.engine}: {len(result.prompt_ids)} prompt tokens in "
              f"{result.prefill_seconds:.2f}s; {len(result.token_ids)} tokens in "
              f"{result.decode_seconds:.2f}s = {result.tokens_per_second:.1f} tokens/s; "
              f"stopped: {result.stopped}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
