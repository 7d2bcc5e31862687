"""What a run shows the people watching it: its logs copied without loss or repetition (`logs`,
`pod_logs`), where its time went (`goodput`), its figures in Airflow's metrics (`metrics`), what it
produced for lineage and assets (`lineage`, `lineage_facets`), and secrets kept out of all of it
(`masking`)."""
