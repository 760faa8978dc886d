"""`cadence dashboard`: a web page over run folders and sandbox services (see docs/dashboard.md)."""
