"""`parashift` command line: generate, plan, serve, bench."""
import argparse
import contextlib
import logging
import sys

from parashift.entrypoints.cli import add_generate_args, add_plan_args
from parashift.planner.cli import add_planner_args
from parashift.planner.profile_cli import add_profile_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parashift", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_generate_args(subparsers)
    add_plan_args(subparsers)
    add_planner_args(subparsers.choices["plan"])
    add_profile_args(subparsers)
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


# What a command that failed to import needs: (the words, the pip extras).
EXTRAS = {"serve": ("the serve extra", "serve"), "bench": ("the serve and bench extras",
                                                          "serve,bench")}


def _install_command(name: str) -> str:
    return f"pip install 'parashift[{EXTRAS[name][1]}]'"


def _missing_extra(name: str, error: ImportError) -> SystemExit:
    return SystemExit(f"parashift {name} needs {EXTRAS[name][0]}, which is not installed "
                      f"({error.name or error} is missing): {_install_command(name)}")


def _add_unavailable(subparsers, name: str, error: ImportError) -> None:
    def fail(args):
        raise _missing_extra(name, error)
    # No options of its own (no prefix characters): every argument, --model or --help
    # included, lands in `rest`, so any `parashift serve ...` gets the message.
    p = subparsers.add_parser(name, help=f"(unavailable: {_install_command(name)})",
                              add_help=False, prefix_chars="\0")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=fail)


@contextlib.contextmanager
def _logging_to_stderr(level_name: str = "info"):
    """parashift's log lines (loading the model, its generation defaults) on stderr while a
    command runs, as vLLM logs; other libraries' loggers stay as they are."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s",
                                           "%m-%d %H:%M:%S"))
    logger = logging.getLogger("parashift")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel("DEBUG" if level_name == "trace" else level_name.upper())
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        with _logging_to_stderr(getattr(args, "log_level", "info")):  # serve's --log-level
            args.func(args)
    except ImportError as e:  # a module of an extra that serve or bench imports late
        if args.command not in EXTRAS:
            raise
        raise _missing_extra(args.command, e) from None
    except (ValueError, FileNotFoundError) as e:
        print(f"parashift {args.command}: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
