"""airflow-volcano: distributed PyTorch training on Volcano as one Airflow task."""

__version__ = "0.1.0"
