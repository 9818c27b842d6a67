"""Model pairs: the registry and pull of real pairs, and the tiny offline pair."""
