"""Prometheus metrics of the reference server (``--metrics-port``): stats.py measures,
observe.py hooks the measuring in, exporter.py serves it."""
