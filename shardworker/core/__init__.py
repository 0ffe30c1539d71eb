"""The shared internals every process and command stands on, below the store and above the
outbox: the data model (``model``, ``records``, ``wire``, ``views``), the configuration and
its limits (``config``, ``limits``, ``dsn``), the rules that decide (``retry``, ``flow``,
``routing``, ``schedule``, ``followups``, ``counts``, ``jobstats``), the outbox directory's
files (``layout``, ``binding``) and the process plumbing (``procs``, ``logs``). Nothing here
imports a process package, the store or the public API; users import the top level
(``shardworker``, ``shardworker.app``, ``.client``, ``.jobs``, ``.queues``, ``.control``,
``.errors``), never this package."""
