"""`fp8probe plan`: what a rollout configuration buys beside what it costs (modelled throughput, time to quality)."""
