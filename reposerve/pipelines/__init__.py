"""Pipelines: models made of other models (ensembles), beside the scheduler."""
