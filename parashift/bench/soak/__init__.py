"""A soak of `parashift serve`: hours of mixed traffic (and killed workers) against one CPU
server, then checks that nothing leaked (scripts/soak.py, `make soak`, docs/reliability.md)."""
