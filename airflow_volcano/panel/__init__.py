"""The "Volcano Job" panel on a task instance's page of the Airflow UI (Airflow 3.1+): a plugin the
provider registers (`plugin.py`), a web app the API server mounts (`app.py`), its data (`data.py`,
`view.py`) and its static page (`static/`)."""
