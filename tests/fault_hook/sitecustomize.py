"""Fault injection in every process of a real batch job (tests/test_faults_kills.py).

A process started with ``PYTHONPATH=<repo>/tests/fault_hook:<repo>`` imports this at startup (the CLI
driver, the local Ray it starts, Ray's workers: they inherit the environment). Only when
``FAULT_PLAN_FILE`` names a JSON plan does it install anything (:mod:`fault_hook_install`); otherwise
it costs one environment look-up. No other ``sitecustomize`` is shadowed on this interpreter (pyenv's
Python has none; Debian's /etc/python3.11 one belongs to the system Python only).
"""

import os

if os.environ.get("FAULT_PLAN_FILE"):
    import fault_hook_install

    fault_hook_install.install(os.environ["FAULT_PLAN_FILE"])
