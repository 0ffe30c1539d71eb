"""``shardworker dashboard``: a web page over the jobs table, served by Starlette and uvicorn.

* ``data``: what the pages show, read from PostgreSQL through ``shardworker.jobs`` and
  ``shardworker.store`` (blocking calls, one connection per request).
* ``security``: who may look and press buttons (a token or basic auth; same-origin POSTs).
* ``app``: the Starlette routes and templates; blocking calls run in the thread pool.
* ``command``: the click command, which refuses a non-loopback bind without a token.
"""
