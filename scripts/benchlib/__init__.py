"""The sections of scripts/bench, one module each (catchup, latency, proxy, scale, failover)."""
