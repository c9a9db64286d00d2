"""`python -m parashift.bench serve|throughput ...`"""
from parashift.bench.cli import main

main()
