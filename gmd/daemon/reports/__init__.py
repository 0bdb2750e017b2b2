"""What the ledger answers, one query per report, shared by gmd-admin (which renders them for
a terminal) and the daemon's read API (which serves them as JSON, SVG and HTML): standings,
usage reports, explanations, the enforcement log and its actions, the balance series and its
plot. Queries take a SQLAlchemy connection and return data; rendering is the caller's."""
