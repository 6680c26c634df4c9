"""``python -m planner``: plan (or explain) a scenario file without a database.

    python -m planner plan --input scenario.json [--output plan.json]
    python -m planner plan < scenario.json > plan.json
    python -m planner explain --input scenario.json [--namespace ID] [--format text|json]

Exit status: 0 on success; 2 for invalid input (unreadable file, malformed
JSON, a scenario that breaks the contract, bad arguments) with exactly one
line on stderr naming the bad field; 1 when the output cannot be written or
on an internal error (also one line). Never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import NoReturn

from planner.core import plan
from planner.explain import explain, render_text
from planner.plan import dumps_bytes
from planner.scenario import Scenario, ScenarioError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INVALID = 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage problem is one line on stderr (exit 2), not a usage page."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m planner", description="Zoekt placement planner.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan_cmd = commands.add_parser("plan", help="scenario JSON in, plan JSON out")
    plan_cmd.add_argument("--input", "-i", help="scenario file (default: stdin)")
    plan_cmd.add_argument("--output", "-o", help="plan file (default: stdout)")
    explain_cmd = commands.add_parser("explain", help="why each index went where it went")
    explain_cmd.add_argument("--input", "-i", help="scenario file (default: stdin)")
    explain_cmd.add_argument("--output", "-o", help="output file (default: stdout)")
    explain_cmd.add_argument("--namespace", type=int, help="only this root namespace id")
    explain_cmd.add_argument("--format", choices=("text", "json"), default="text")
    return parser


def _read(path: str | None) -> bytes:
    if path is None or path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise ScenarioError("--input", f"cannot read {path}: {exc.strerror or exc}") from None


def _write(path: str | None, data: bytes) -> None:
    if path is None or path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    with open(path, "wb") as handle:
        handle.write(data)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        scenario = Scenario.from_json(_read(args.input))
        if args.command == "plan":
            data = plan(scenario, record_decisions=False).to_json_bytes() + b"\n"
        else:
            explanations = explain(plan(scenario), namespace_id=args.namespace)
            if args.format == "json":
                data = dumps_bytes(explanations) + b"\n"
            else:
                data = render_text(explanations).encode()
        _write(args.output, data)
    except _UsageError as exc:
        print(f"usage error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_INVALID
    except ScenarioError as exc:
        print(f"invalid scenario: {_one_line(exc)}", file=sys.stderr)
        return EXIT_INVALID
    except BrokenPipeError:
        # The reader went away: keep the interpreter's final flush quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except OSError as exc:
        print(f"cannot write output: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback
        print(f"internal error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    # One scenario, then exit: the cyclic collector would only walk the
    # millions of (acyclic) objects of a large scenario again and again.
    gc.disable()
    sys.exit(main())
