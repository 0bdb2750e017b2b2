"""What the tests import: fixture plugins, fakes, builders of ledgers, hosts and guests."""
