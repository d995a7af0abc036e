"""Scheduling requests onto instances: a pure batch-forming policy and the asyncio
scheduler that applies it per model version."""
