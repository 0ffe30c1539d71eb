"""Integrations with other frameworks, each an optional extra that imports its framework:
``shardworker.contrib.django`` (``pip install shardworker[django]``). Each uses shardworker
through its public API only (``shardworker.client``, ``shardworker.jobs``, ``shardworker.app``)."""
