"""servediag kv-budget: plan the KV cache, and read each engine's live capacity."""
