"""``python -m shardworker``: the command line of ``shardworker.cli.main``."""

from shardworker.cli.main import main

main()
