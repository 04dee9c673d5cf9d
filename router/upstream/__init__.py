"""Talking to the engines: proxy, HTTP client and wire, health, failures, pools, simulator."""
