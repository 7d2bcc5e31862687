"""airflow-volcano: distributed PyTorch training on Volcano as one Airflow task."""

from importlib.metadata import version

# The version is pyproject.toml's alone; the installed package's metadata carries it here.
__version__ = version("airflow-volcano")
