"""Everything that talks to PostgreSQL.

The only package that imports psycopg.
"""
