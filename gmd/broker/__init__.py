"""gmd-broker: each cloud's broker in a federation of clouds that lend each other capacity
(CloudShare, issue 32), coordinated over ZooKeeper.

A program of its own, not a mode of gmd-daemon: a broker holds a ZooKeeper session whose
expiry must stop it from starting work (it pauses when its session is suspended), and it boots
and deletes servers in another cloud's name. Neither may ever stall or stop the daemon's
ingest and accounting; a broker can be restarted, upgraded or left out without touching the
ledger's daemon. It keeps its history in its cloud's ledger database all the same.
"""
