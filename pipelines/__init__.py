"""Ray Data jobs over the ``memagent`` library: batch QA, evaluation, synthesis, reports.

Every module here is imported through this package first, so this is the one place that makes
a *local* Ray (started by a job in this process) bind 127.0.0.1: Ray reads the variable when it
is imported, and a cluster given by address is unaffected.
"""

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
