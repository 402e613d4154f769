"""Followers of the notification log: leases, positions, the one follower loop, wake-ups, status, interventions."""
