"""The research harness: experiment designs, the experiment flow, checkpoint studies, records and claims.

It runs the pipeline (``flows``, ``tasks``, ``infra``, ``rao_core``); the pipeline never imports it.
Docs: docs/experiments.md.
"""
