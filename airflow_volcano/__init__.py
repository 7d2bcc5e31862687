"""airflow-volcano: distributed PyTorch training on Volcano as one Airflow task."""

from importlib.metadata import PackageNotFoundError, version

# The version is pyproject.toml's alone; the installed package's metadata carries it here.
try:
    __version__ = version("airflow-volcano")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
