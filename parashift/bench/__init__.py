"""Benchmarks: the named workloads of workloads.py against a server (`bench serve`)
or the offline engine (`bench throughput`), with metrics, files and plots."""
