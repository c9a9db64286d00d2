"""KV cache: logical block tables and prefix caching (block_manager), later the
physical pool, the layout adaptor and the CPU tier."""
