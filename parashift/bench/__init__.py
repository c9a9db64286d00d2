"""Benchmarks: the workloads of workloads.md against a server (`bench serve`)
or the offline engine (`bench throughput`), with metrics, files and plots."""
