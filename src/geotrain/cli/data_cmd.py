"""`geotrain data prepare INPUT --out FILE`: tokenize text / jsonl once into a token file + JSON sidecar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geotrain.cli.arg_types import output_file
from geotrain.cli.help_format import DefaultsHelpFormatter
from geotrain.cli.output import Output


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("data", help="prepare training data", description="Prepare training data.")
    children = parser.add_subparsers(dest="data_command", metavar="NAME", required=True)
    prepare = children.add_parser(
        "prepare", help="tokenize text/jsonl once into a token file (uint16/uint32 ids + .json sidecar)",
        description="Tokenize a text/jsonl file or directory into FILE (raw ids) and FILE.json (dtype, vocab, "
                    "tokenizer, validation split), ready for --data FILE.",
        formatter_class=DefaultsHelpFormatter)
    prepare.add_argument("input", metavar="INPUT", help="text (.txt/.md) or jsonl ({\"text\": ...} per line) file, "
                                                        "or a directory of them")
    prepare.add_argument("--out", required=True, type=output_file, metavar="FILE", help="token file to write (e.g. data/tokens.bin)")
    prepare.add_argument("--tokenizer", default="bytes", metavar="bytes|hf:DIR",
                         help="UTF-8 bytes (256 ids) or a local Hugging Face tokenizer directory")
    prepare.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                         help="held-out share of the tokens (the last ones), in [0, 1)")
    prepare.add_argument("--json", action="store_true", help="print the sidecar written as one JSON object")
    prepare.set_defaults(handler=run_prepare)


def run_prepare(args: Any) -> int:
    from geotrain.data import prepare_token_file

    out = Output(json_mode=args.json)
    sidecar = prepare_token_file(args.input, args.out, tokenizer=args.tokenizer, val_fraction=args.val_fraction)
    if args.json:
        out.emit_json({"out": str(args.out), **sidecar})
        return 0
    tokens = sidecar["tokens"]
    val_start = sidecar.get("val_start", tokens)
    out.table(f"{args.input} -> {args.out}", ["", "value"], [
        ["documents", sidecar["documents"]],
        ["tokens", tokens],
        ["train tokens", val_start],
        ["validation tokens", tokens - val_start],
        ["tokenizer", sidecar["tokenizer"]],
        ["vocab size", sidecar["vocab_size"]],
        ["dtype", sidecar["dtype"]],
        ["bytes written", Path(args.out).stat().st_size],
    ], right_align_from=1)
    return 0
