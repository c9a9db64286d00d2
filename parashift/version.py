"""The package's version, apart from the package's front (`parashift/__init__.py`) so that
the modules it leads to can read it without importing it."""


def read_version() -> str:
    """The installed package's version; in a source tree that is not installed, the
    version pyproject.toml declares."""
    from importlib import metadata
    try:
        return metadata.version("parashift")
    except metadata.PackageNotFoundError:
        return _pyproject_version()


def _pyproject_version() -> str:
    import pathlib
    import tomllib
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


__version__ = read_version()
