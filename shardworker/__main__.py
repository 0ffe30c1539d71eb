"""``python -m shardworker``: the command line of ``shardworker.cli``."""

from shardworker.cli import main

main()
