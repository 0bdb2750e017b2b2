"""Customers named by a project id spelled otherwise than Keystone writes it (dashes, upper
case) renamed to the one spelling (:func:`gmd.wire.canonical_customer`), which ingest now
stores and every lookup uses: a project spelled two ways was two customers, one its members
could not read.

A customer whose canonical name is already taken by another row keeps its name (merging two
customers' history is the operator's decision): the migration says which, and the operator
can still name it by its stored spelling. The downgrade changes nothing (the old spelling is
not kept, and the old code reads canonical names as it reads any other).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 05:00:00.000000
"""

import logging
import re

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")

# As gmd.wire's, written here: a migration keeps the rule it was written with.
_PROJECT_ID = re.compile(
    r"[0-9a-fA-F]{32}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def upgrade() -> None:
    conn = op.get_bind()
    customers = sa.table("customers", sa.column("id", sa.BigInteger), sa.column("name"))
    rows = conn.execute(sa.select(customers.c.id, customers.c.name)).all()
    taken = {str(name) for _, name in rows}
    for cid, name in rows:
        if not _PROJECT_ID.fullmatch(name):
            continue
        canonical = name.replace("-", "").lower()
        if canonical == name:
            continue
        if canonical in taken:
            log.warning(
                "customer %r kept its name: %r is another customer (merge them by hand if"
                " they are one project)",
                name,
                canonical,
            )
            continue
        conn.execute(sa.update(customers).where(customers.c.id == cid).values(name=canonical))
        taken.discard(name)
        taken.add(canonical)


def downgrade() -> None:
    pass
