"""Agent → daemon: the HTTP client, the on-disk SQLite spool, and the sender that replays it.

Every batch goes through the spool: it is written there (together with the counters it was
computed from) before it is posted, and removed only once the daemon acknowledged it. That is
what makes a usage delta travel under exactly one idempotency key, across daemon outages and
agent crashes alike.
"""
