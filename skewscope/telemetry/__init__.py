"""Who and why on top of an analysis (issue 27): what people call each address (the
inventory: core/inventory.py, a file or Prometheus labels), and why a blamed node is slow
(GPU telemetry). The wire decides who is blamed; nothing here changes a finding's kind,
severity or entities -- it adds names and a `cause`.

enrich.py   Enricher: the one step every command runs on an analysis document (report,
            diagnose, cluster, capture; the live runner for top, export and watch)
dcgm.py     DCGM series from a dcgm-exporter scrape (URL or file) or a Prometheus
cause.py    finding["cause"]: the blamed GPU's telemetry next to its group's
"""
