"""`sapo-node export`: write the trained model as GGUF, an Ollama folder, a Hugging Face folder or
a PEFT adapter, always with a model card (see sapo_core/export.py).

`--progress-json` prints one JSON object per step (`{"progress": 0.35, "step": "..."}`) so the
app can drive a progress bar; the last line is `{"done": true, "files": [...]}` or
`{"error": "..."}`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sapo_core import paths


def configure(p: argparse.ArgumentParser) -> None:
    from sapo_core.export import FORMATS, QUANTS

    p.add_argument("--run-dir", help="the run to export (default: the data directory's default run)")
    p.add_argument("--round", type=int, help="export this round's checkpoint (default: the newest kept)")
    p.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        help="gguf: merged, for llama.cpp / LM Studio; ollama: GGUF + Modelfile; "
        "hf: merged Hugging Face folder; peft: the bare LoRA adapter",
    )
    p.add_argument(
        "--quant",
        default="f16",
        choices=QUANTS,
        help="GGUF weight type: f16 (default) is what you trained; q8_0 is half the size and its "
        "log-probs are ~0.07 nats/token from the trainer's",
    )
    p.add_argument("--output", required=True, help="folder to create (must not exist or be empty)")
    p.add_argument("--threads", type=int, default=0, help="threads for converting (default: physical cores)")
    p.add_argument("--progress-json", action="store_true", help="print progress as JSON lines (for the app)")


def main(args: argparse.Namespace) -> int:
    from sapo_core.config import ConfigError
    from sapo_core.downloads import terminal_download
    from sapo_core.export import ExportFailed, ExportRequest, export

    def progress(fraction: float, step: str) -> None:
        if args.progress_json:
            print(json.dumps({"progress": round(fraction, 3), "step": step}), flush=True)
        else:
            print(f"[{fraction * 100:3.0f} %] {step}", flush=True)

    run_dir = Path(args.run_dir).expanduser() if args.run_dir else paths.default_run_dir()
    try:
        req = ExportRequest(
            run_dir=run_dir,
            output=Path(args.output).expanduser(),
            format=args.format,
            quant=args.quant,
            round=args.round,
            threads=args.threads,
        )
        files = export(req, progress, terminal_download("sapo-node export"))
    except (ExportFailed, ConfigError) as e:
        if args.progress_json:
            print(json.dumps({"error": str(e)}), flush=True)
        print(f"sapo-node export: {e}", file=sys.stderr)
        return 2
    if args.progress_json:
        print(json.dumps({"done": True, "files": [str(f) for f in files]}), flush=True)
    else:
        print(f"wrote {len(files)} files to {req.output}:")
        for f in files:
            print(f"  {f.name}  ({f.stat().st_size / 1e6:.1f} MB)")
    return 0
