"""Benchmarks: a V2 load generator, baseline servers, scenarios and plots.

``python -m tools.bench --help`` lists the scenarios. Every scenario measures its
baselines in the same run and reports ratios, since absolute numbers drift on shared
machines.
"""
