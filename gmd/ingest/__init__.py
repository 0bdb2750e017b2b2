"""The daemon's HTTP API: agents post samples and fetch plans; Prometheus scrapes /metrics."""
