"""The shell scripts (and the argv shim) the pods of a hostfile launch run, shipped unchanged in the
training script's ConfigMap: package data, read by airflow_volcano.hostfile_launch."""
