"""Developer tools: benchmarks (tools.bench), the soak run (tools.soak), example export."""
