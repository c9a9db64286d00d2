"""`python -m parashift.entrypoints.openai serve [MODEL] ...`"""
from parashift.entrypoints.openai.cli_args import main

main()
