"""Repository tooling for Google Cloud: job specs, the worker container and the submission wrapper.

Not shipped to workers (setup.py packages only pipeline/model/eval); run from a checkout.
"""
