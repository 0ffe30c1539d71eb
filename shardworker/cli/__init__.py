"""The ``shardworker`` command line: click commands only, thin over the library."""
