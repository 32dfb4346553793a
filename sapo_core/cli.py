"""`sapo-node`: the command-line client of the node.

Each subcommand lives in `sapo_core/commands/<name>.py` with `configure(parser)` and
`main(args) -> int`, imported only when chosen so `sapo-node --help` stays instant.
Every subcommand takes `--log-level` (logs.py): log records print on stderr, prefixed with the
command (`sapo-node eval: ...`); a node that `sapo-node run` starts inherits the level.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sapo_core import logs

# (subcommand, module, one-line help)
COMMANDS: list[tuple[str, str, str]] = [
    ("identity", "sapo_core.commands.identity", "show this node's identity, export it for backup, or import one"),
    ("run", "sapo_core.commands.run", "train: run rounds of SAPO on this machine"),
    ("eval", "sapo_core.commands.eval", "held-out solve rate of a run's checkpoint against the base model"),
    ("hardware", "sapo_core.commands.hardware", "show what this machine has and which model fits"),
    ("doctor", "sapo_core.commands.doctor", "check this machine can run a node, with a fix for each problem"),
    ("export", "sapo_core.commands.export", "write the trained model as GGUF, Ollama, Hugging Face or a LoRA adapter"),
    ("stats", "sapo_core.commands.stats", "what this node gave (CPU-hours, rounds, groups) and peers' receipts"),
    ("try", "sapo_core.commands.try", "answer a question with the base and the trained model, with rewards"),
    ("swarms", "sapo_core.commands.swarms", "list the swarms this node knows, or add one from an invitation"),
    ("seed", "sapo_core.commands.seed", "serve a swarm on a public address: DHT, relay and dial-backs, no training"),
]


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    from sapo_core import __version__

    parser = argparse.ArgumentParser(prog="sapo-node", description="SAPO Swarm node")
    parser.add_argument("--version", action="version", version=f"sapo-node {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, help_text in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == load:
            importlib.import_module(module).configure(p)
        logs.add_level_argument(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    known = {name for name, _, _ in COMMANDS}
    parser = build_parser(chosen if chosen in known else None)
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    logs.apply_level_argument(args)
    logs.to_stderr(prefix=f"sapo-node {args.command}: ")
    return int(importlib.import_module(args._module).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
