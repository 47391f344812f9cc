"""Outputs: the report (JSON contract and human), the top view, the Prometheus exporter, the fleet fusion (cluster)."""
