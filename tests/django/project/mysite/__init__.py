"""A small Django project whose tasks run on shardworker (tests/django)."""
