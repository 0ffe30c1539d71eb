"""The schema's migration files, ``NNNN_what_it_does.sql``: the only copy.

The build maps this directory to the package ``shardworker.migrations`` so that wheels carry
the files; ``shardworker.store.schema`` reads them through ``importlib.resources``.
"""
