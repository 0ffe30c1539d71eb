"""A child process: its loop, its lanes, running one handler, and the group commit into its outbox shard.

Never holds a database connection and never imports ``shardworker.store``.
"""
