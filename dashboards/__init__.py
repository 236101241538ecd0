"""Grafana dashboards and Prometheus alert rules of nodelock (``dashboards/README.md``).

Not part of the installed package: ``python -m dashboards.build`` regenerates the dashboards'
JSON from ``build.py``; ``promql.py`` helps the tests evaluate every query on a real Prometheus.
"""
