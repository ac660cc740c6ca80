"""Repository tooling for Google Cloud: job specs, the worker container and the submission wrapper.

Installed with the package (its specs and templates as package data), so `python -m infra.submit`
runs from any folder; Dataflow workers never import it.
"""
