from shardworker.cli import main

main()
