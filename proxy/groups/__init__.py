"""The runtime of consumer groups: one consumer per topic, its chain, its readers and owned queues."""
