"""Observability: Prometheus metrics, their plain-Python tallies, and the logs setup."""
