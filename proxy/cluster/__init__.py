"""Sharing queues between proxies: leases, membership, ownership of queues, offset commits, read audits."""
