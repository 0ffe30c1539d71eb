"""The flusher: the loop that drains the outbox into PostgreSQL, its process, and ``outbox drain``."""
