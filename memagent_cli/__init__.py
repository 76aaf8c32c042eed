"""The ``memagent`` command line: one room above ``memagent`` (the library) and ``pipelines`` (Ray jobs).

Neither of those imports this package; its flags come from their typed configs.
"""
