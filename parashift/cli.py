"""`parashift` command line: generate, plan, serve, bench."""
import argparse
import sys

from parashift.entrypoints.cli import add_generate_args, add_plan_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parashift", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_generate_args(subparsers)
    add_plan_args(subparsers)
    _add_optional_commands(subparsers)
    return parser


def _add_optional_commands(subparsers) -> None:
    """`serve` and `bench` need the `serve` extra; without it they explain why."""
    try:
        from parashift.entrypoints.openai.cli_args import add_serve_args
        add_serve_args(subparsers)
    except ImportError as e:
        _add_unavailable(subparsers, "serve", e)
    try:
        from parashift.bench.cli import add_bench_args
        add_bench_args(subparsers)
    except ImportError as e:
        _add_unavailable(subparsers, "bench", e)


def _add_unavailable(subparsers, name: str, error: ImportError) -> None:
    def fail(args):
        raise SystemExit(f"parashift {name} is unavailable: {error} "
                         "(install the extra: pip install 'parashift[serve,bench]')")
    p = subparsers.add_parser(name, help=f"(unavailable: {error.name} is not installed)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=fail)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"parashift {args.command}: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
