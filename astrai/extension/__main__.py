"""Command line of the image loader: `python -m astrai.extension info|verify [--json]`."""

from __future__ import annotations

import argparse
import json
import sys

from astrai.extension import loader


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m astrai.extension",
        description="Explain which astrai-kernels image this process would load, or verify the images.")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="torch, driver, devices, every image found and the choice made")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    verify = commands.add_parser(
        "verify", help="recompute checksums, load every family, smoke-launch each where a GPU is present")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.add_argument("--no-smoke", action="store_true", help="skip the smoke launches")
    args = parser.parse_args(argv)

    if args.command == "info":
        desc = loader.describe()
        print(json.dumps(desc, indent=2) if args.json else loader.format_info(desc))
        return 0
    report = loader.verify(smoke=not args.no_smoke)
    print(json.dumps(report, indent=2) if args.json else loader.format_verify(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
