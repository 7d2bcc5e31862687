# The official Airflow image with this provider installed, for docker-compose.yaml.
# The Airflow version is constraints.txt's (tests/unit/test_compose_file.py checks it), and so is
# the Python version: constraints.txt is the set the suite passed with, resolved on Python 3.11.
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION

COPY --chown=airflow:0 pyproject.toml README.md LICENSE constraints.txt /opt/airflow-volcano/
COPY --chown=airflow:0 airflow_volcano /opt/airflow-volcano/airflow_volcano
# Naming apache-airflow keeps pip from moving the image's Airflow; the constraints pin everything else.
RUN pip install --no-cache-dir -c /opt/airflow-volcano/constraints.txt \
        "apache-airflow==${AIRFLOW_VERSION}" /opt/airflow-volcano
