"""``shardworker demo`` and ``demo --outage``: sample handlers and the live outage demonstration."""
